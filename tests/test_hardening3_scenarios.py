"""Unbounded scenarios (issue 63, item 8): any client creates a scenario with a new
`x-reef-scenario`, and each held an open file (its JSONL commit log) for life, so past ~1,000
scenarios at the usual 1,024-descriptor limit every route failed, also after a restart.

Now an idle scenario holds no descriptor (a log opens its file only while locked), and
`limits.max_scenarios` refuses a scenario past the limit with 403 in the client's dialect,
creating nothing. Real `reef serve` processes (upstream runtime in front of the scripted
provider) with their descriptor limit lowered, the official SDKs, a recovery in a subprocess
under a low limit.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from reef.commit.state import ReefState
from reef.core.canonical import scenario_key
from tests.helpers.reef_server import ROOT, ReefServer
from tests.scripted_upstream import ScriptedUpstream

HEADROOM = 40  # descriptors above what the server holds at rest: the old code ran out after ~HEADROOM scenarios
SCENARIOS = 3 * HEADROOM


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(record=False) as up:
        yield up


def skills_server(workdir: Path, upstream: ScriptedUpstream, **settings: object) -> ReefServer:
    return ReefServer(
        workdir,
        {
            "recipes": {"default": "skills"},
            "learner": {"enabled": False},
            "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
            **settings,
        },
    )


def chat(server: ReefServer, scenario: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": scenario},
        timeout=30,
        json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
    )


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_many_scenarios_under_a_low_descriptor_limit_keep_every_route_working(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    with skills_server(tmp_path, upstream) as server:
        assert chat(server, "warm").status_code == 200  # the first request's descriptors, before counting
        assert server.process is not None
        pid = server.process.pid
        at_rest = open_descriptors(pid)
        limit = at_rest + HEADROOM
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
        for i in range(SCENARIOS):
            answer = chat(server, f"s{i}")  # before: 500/503 from about the HEADROOM-th on
            assert answer.status_code == 200, (i, answer.text)
        assert open_descriptors(pid) < limit - HEADROOM // 2  # does not grow with the scenarios
        assert chat(server, "s0").status_code == 200
        listed = httpx.get(f"{server.url}/reef/scenarios", timeout=30)
        assert listed.status_code == 200 and len(listed.json()["scenarios"]) == SCENARIOS + 1
        first = listed.json()["scenarios"][0]
        rolled = httpx.post(
            f"{server.url}/reef/scenarios/{first['name']}/rollback",
            json={"release_id": first["head"]["release_id"]},
            timeout=30,
        )
        assert rolled.status_code == 200, rolled.text
        assert httpx.get(f"{server.url}/reef/status", timeout=30).status_code == 200


def test_recovery_of_many_scenarios_needs_no_descriptor_each(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as state:
        for i in range(SCENARIOS):
            state.create(f"s{i}", "skills")
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, ({HEADROOM}, {HEADROOM}))
        from reef.commit.state import ReefState
        with ReefState.open(sys.argv[1]) as state:  # before: OSError, too many open files
            assert len(state.scenarios()) == {SCENARIOS}
            chain = state.chain("s{SCENARIOS - 1}")
            chain.rollback(chain.head().release_id, None)
        print("ok")
    """)
    # `import reef` in the child finds the package through the venv's editable install or ROOT
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_past_max_scenarios_a_new_scenario_is_refused_in_each_dialect_and_nothing_is_created(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    server = skills_server(tmp_path, upstream, limits={"max_scenarios": 2})
    with server:
        oai = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=30)
        ant = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=30)
        for name in ("a", "b"):
            oai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-reef-scenario": name}
            )
        with pytest.raises(openai.PermissionDeniedError, match="limits.max_scenarios") as refused:
            oai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-reef-scenario": "c"}
            )
        assert refused.value.status_code == 403
        assert refused.value.response.json()["error"]["type"] == "permission_error"
        assert "x-reef-agent-record-id" not in refused.value.response.headers  # no record stored
        with pytest.raises(anthropic.PermissionDeniedError, match="limits.max_scenarios") as refused_too:
            ant.messages.create(
                model="m",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-reef-scenario": "c"},
            )
        assert refused_too.value.response.json()["error"]["type"] == "permission_error"
        created = httpx.post(f"{server.url}/reef/scenarios", json={"name": "c"}, timeout=30)
        assert created.status_code == 403 and created.json()["error"]["type"] == "permission_error", created.text
        again = httpx.post(f"{server.url}/reef/scenarios", json={"name": "a"}, timeout=30)
        assert again.status_code == 201, again.text  # an existing scenario is returned, as before
        assert [s["name"] for s in httpx.get(f"{server.url}/reef/scenarios", timeout=30).json()["scenarios"]] == [
            "a",
            "b",
        ]
        assert httpx.get(f"{server.url}/reef/status", timeout=30).json()["storage"]["records"] == 2
        assert (
            oai.chat.completions.with_raw_response.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-reef-scenario": "b"},
            ).http_response.status_code
            == 200
        )
    state = server.state_dir
    assert not (state / "commits" / f"{scenario_key('c')}.jsonl").exists()
    refs = subprocess.run(
        ["git", "--git-dir", str(state / "artifacts.git"), "for-each-ref", "--format=%(refname)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(refs) == sorted(f"refs/reef/scenarios/{scenario_key(n)}" for n in ("a", "b"))
    with server:  # the limit holds across a restart
        assert chat(server, "c").status_code == 403
