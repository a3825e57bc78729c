"""The agent-wrapper routes: the install script and the harness laid out for one agent.

    GET /reef/harness/install?adapter=claude|opencode|pi|codex|generic[&scenario=S][&url=U]
        a POSIX sh script installing `reef-agent` (see reef/surfaces/agent_install.py), naming
        Reef at U, else at the `public_url` setting, else at the request's (checked) Host
    GET /reef/harness/files?adapter=A&scenario=S[&release_id=R]
        the harness of the scenario's serving release (or of R) as a tar archive of plain files,
        laid out for the adapter (see reef/surfaces/agent_layout.py). In inject mode Reef adds
        the harness to every request itself, so the archive holds only a note saying so (the
        agent would otherwise read every rule twice).

Both need the token like every `/reef` route.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reef.core.canonical import check_id, check_scenario_name
from reef.surfaces.agent_install import install_script, server_url
from reef.surfaces.agent_layout import adapter_named, inject_note, layout, pack_tar


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef/harness")

    @router.get("/install")
    async def install(
        request: Request, adapter: str | None = None, scenario: str = "default", url: str | None = None
    ) -> Response:
        # the raw Host header, not request.base_url: Starlette swaps an invalid Host for the socket's address
        base = server_url(
            url, request.app.state.reef.config.public_url, request.url.scheme, request.headers.get("host")
        )
        script = install_script(adapter_named(adapter), base, check_scenario_name(scenario))
        return Response(script, media_type="text/x-shellscript; charset=utf-8")

    @router.get("/files")
    async def files(
        request: Request, adapter: str | None = None, scenario: str | None = None, release_id: str | None = None
    ) -> Response:
        chosen = adapter_named(adapter)
        name = check_scenario_name(scenario or request.headers.get("x-reef-scenario") or "default")
        app = request.app.state.reef
        chain = app.state.chain(name)
        release = chain.release(check_id(release_id, "release_id")).ref if release_id else chain.serving()
        tree = await app.scenarios.harness.tree(release.release_id, release.content_id)
        mode = app.config.harness.mode_for(name)
        files = (
            layout(tree, chosen, name, release.release_id) if mode == "pull" else inject_note(name, release.release_id)
        )
        return Response(
            pack_tar(files),
            media_type="application/x-tar",
            headers={
                "x-reef-release-id": release.release_id,
                "x-reef-content-id": tree.content_id,
                "x-reef-harness-mode": mode,
            },
        )

    return router
