"""Routes of the harness surface: the tree a client pulls, what a release changed, promote.

GET  /reef/harness                              the serving harness of a scenario (?release_id=)
GET  /reef/scenarios/{s}/releases/{id}/diff     a release against its parent
POST /reef/scenarios/{s}/promote                serve a release held for review
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from fastapi import APIRouter, Request

from reef.core.canonical import check_id, check_scenario_name
from reef.serve.openapi_bodies import model_body
from reef.serve.routes_reef import _Body, validated
from reef.surfaces.harness import PREFIX, HarnessTree, render_system


class PromoteBody(_Body):
    release_id: str
    expected_head: str | None = None


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef")

    @router.get("/harness")
    async def harness(request: Request, scenario: str | None = None, release_id: str | None = None) -> dict[str, Any]:
        """The harness of a scenario's serving release (or of `release_id` in its chain)."""
        app = request.app.state.reef
        name = check_scenario_name(scenario or request.headers.get("x-reef-scenario") or "default")
        chain = app.state.chain(name)
        if release_id is None:
            ref = chain.serving()
            release_id, content_id = ref.release_id, ref.content_id
        else:
            release = chain.release(check_id(release_id, "release_id"))
            content_id = release.content_id
        tree = await app.scenarios.harness.tree(release_id, content_id)
        return {
            "scenario": name,
            "release_id": release_id,
            "content_id": content_id,
            "harness_content_id": tree.content_id,
            "mode": app.config.harness.mode_for(name),
            **tree_json(tree),
        }

    @router.get("/scenarios/{name}/releases/{release_id}/diff")
    async def diff(name: str, release_id: str, request: Request) -> dict[str, Any]:
        """What a release changed against its parent (a creation: against nothing, or the
        release it forked)."""
        app = request.app.state.reef
        release = app.state.chain(check_scenario_name(name)).release(check_id(release_id, "release_id"))
        parent = release.parent_release_id
        changed, text = await asyncio.to_thread(app.state.artifacts.content_diff, parent, release.release_id)
        return {
            "scenario": name,
            "release_id": release.release_id,
            "parent_release_id": parent,
            "operation": release.operation.value,
            "changed": changed,
            "diff": text,
        }

    @router.post("/scenarios/{name}/promote", openapi_extra=model_body(PromoteBody, "the pending release to publish"))
    async def promote(name: str, request: Request) -> dict[str, Any]:
        """Publish a release the gate held for review (`publish: review`) and serve it."""
        body: PromoteBody = validated(PromoteBody, await request.body())
        app = request.app.state.reef
        chain = app.state.chain(check_scenario_name(name))
        expected = check_id(body.expected_head, "expected_head") if body.expected_head else None
        release = await asyncio.to_thread(chain.promote, check_id(body.release_id, "release_id"), expected)
        await app.learning.head_moved(name)  # the canary stops before the answer (its line is not the head's)
        serving = await app.scenarios.serve_release(chain, release)
        return {"release": release.to_json(), "serving": serving.to_json()}

    return router


def tree_json(tree: HarnessTree) -> dict[str, Any]:
    """Text files as text; a file that is not UTF-8 (an extension's binary) in `binary_files`,
    base64-encoded."""
    files: dict[str, str] = {}
    binary: dict[str, str] = {}
    for path, data in tree.to_files().items():
        rel = path[len(PREFIX) :]
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            binary[rel] = base64.b64encode(data).decode("ascii")
    return {
        "files": files,
        "binary_files": binary,
        "skills": [{"name": s.name, "description": s.description} for _, s in sorted(tree.skills.items())],
        "system_prompt": render_system(tree, ""),
    }
