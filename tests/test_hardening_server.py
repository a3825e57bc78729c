"""Hardening of the server process (issue 12): connections that idle or send half a request are
closed, SIGTERM finishes within `shutdown_timeout` even with a stream stuck on its provider, the
install script names only a checked or configured URL, concurrent rollbacks without
`expected_head` all succeed, and opening the state does not slow down as the chain grows.

Real `reef serve` processes (tests/helpers/reef_server.py) in front of a scripted provider, raw
sockets where a well-behaved client library would not misbehave, real git."""

from __future__ import annotations

import asyncio
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from click.testing import CliRunner

from reef.cli import main
from reef.commit.artifacts import ArtifactStore
from reef.commit.release_chain import Candidate, ReleaseChain
from reef.commit.state import ReefState
from reef.config import load_config
from reef.core.errors import Corruption, InvalidInput, MissingArtifact
from reef.core.types import ArtifactKind, Release, Verdict
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "hardening-token-7d2a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PUBLIC_URL = "https://reef.example.com/team-a"
TIMEOUT = 1.0  # header_timeout, body_timeout and keep_alive_timeout of the hardened server
SLACK = 3.0  # a loaded 2-core machine


def _settings(upstream: ScriptedUpstream, **extra: Any) -> dict[str, Any]:
    return {
        "tokens": [TOKEN],
        "learner": {"enabled": False},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 60},
        **extra,
    }


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, upstream: ScriptedUpstream) -> Iterator[ReefServer]:
    """Only settings every version knows: what it shows holds by default."""
    with ReefServer(tmp_path_factory.mktemp("plain"), _settings(upstream)) as server:
        yield server


@pytest.fixture(scope="module")
def hardened(tmp_path_factory: pytest.TempPathFactory, upstream: ScriptedUpstream) -> Iterator[ReefServer]:
    settings = _settings(
        upstream, public_url=PUBLIC_URL, keep_alive_timeout=TIMEOUT, header_timeout=TIMEOUT, body_timeout=TIMEOUT
    )
    with ReefServer(tmp_path_factory.mktemp("hardened"), settings) as server:
        yield server


# -- connections ------------------------------------------------------------------------------


def _connect(server: ReefServer, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    if data:
        sock.sendall(data)
    return sock


def _until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float | None]:
    """What the server sent, and after how long it closed the connection (None: still open)."""
    start = time.monotonic()
    received = b""
    while (left := start + seconds - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return received, time.monotonic() - start
        received += chunk
    return received, None


def _request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {TOKEN}",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_idle_and_half_sent_connections_are_closed(hardened: ReefServer) -> None:
    silent = _connect(hardened)
    half_head = _connect(hardened, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: ")
    answered = _connect(hardened, _request("GET", "/healthz"))
    half_body = _connect(
        hardened,
        _request(
            "POST", "/v1/chat/completions", b'{"model": "m", ', content_type="application/json", content_length="200"
        ),
    )
    deadline = time.monotonic() + TIMEOUT + SLACK
    for sock in (silent, half_head, answered, half_body):
        with sock:
            received, closed_after = _until_closed(sock, deadline - time.monotonic())
            assert closed_after is not None, f"still open after {TIMEOUT + SLACK}s: {received[:80]!r}"
            if sock is half_head:
                assert received.startswith(b"HTTP/1.1 408 ") and b"header_timeout" in received
            if sock is answered:
                assert received.startswith(b"HTTP/1.1 200 ")


def test_a_trickled_head_is_closed_at_its_deadline(hardened: ReefServer) -> None:
    """Data does not extend the head's deadline: one byte every 0.2 s is still cut off."""
    with _connect(hardened, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n") as sock:
        start = time.monotonic()
        while time.monotonic() - start < TIMEOUT + SLACK:
            if select.select([sock], [], [], 0.2)[0]:
                break  # the 408, or the close
            try:
                sock.sendall(b"x")
            except OSError:
                break
        received, closed_after = _until_closed(sock, SLACK)
        assert closed_after is not None and time.monotonic() - start < TIMEOUT + SLACK
        assert received.startswith(b"HTTP/1.1 408 ")


def test_slow_but_live_requests_are_not_cut(hardened: ReefServer, upstream: ScriptedUpstream) -> None:
    """The deadlines bound a client's silence, not Reef's work: a body sent in pieces with
    pauses under body_timeout, and an answer that takes longer than every timeout, both succeed."""
    upstream.script(text="late but fine", delay=TIMEOUT * 1.5)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    pieces = [body[i : i + 24] for i in range(0, len(body), 24)]
    with _connect(
        hardened,
        _request("POST", "/v1/chat/completions", content_type="application/json", content_length=str(len(body))),
    ) as sock:
        for piece in pieces:
            time.sleep(TIMEOUT / 2)
            sock.sendall(piece)
        received, _ = _until_closed(sock, 10)
    assert received.startswith(b"HTTP/1.1 200 ") and b"late but fine" in received


# -- SIGTERM ------------------------------------------------------------------------------------


def test_sigterm_finishes_within_shutdown_timeout_while_a_stream_is_stuck(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    shutdown_timeout = 1.0
    server = ReefServer(tmp_path, _settings(upstream, shutdown_timeout=shutdown_timeout)).start()
    streaming = threading.Event()
    try:
        upstream.script(text="one two three four five six seven", mode="stall_midstream")
        reader = threading.Thread(target=_read_stream, args=(server, streaming), daemon=True)
        reader.start()
        assert streaming.wait(10), "the stream never started"
        start = time.monotonic()
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        try:
            code = server.process.wait(timeout=shutdown_timeout + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"reef serve still running {shutdown_timeout + 10}s after SIGTERM:\n{server.logs()[-2000:]}")
        took = time.monotonic() - start
        assert code in (0, -signal.SIGTERM), server.logs()[-2000:]  # uvicorn re-raises the signal it caught
        assert took < shutdown_timeout + SLACK, f"SIGTERM took {took:.1f}s"
        assert "timeout graceful shutdown exceeded" in server.logs()
        reader.join(5)
        assert not reader.is_alive(), "the stuck stream's client was never let go"
    finally:
        server.kill()
        server.stop()


def _read_stream(server: ReefServer, streaming: threading.Event) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.stream(
            "POST", f"{server.base_url}/chat/completions", json=body, headers=AUTH, timeout=httpx.Timeout(60)
        ) as answer:
            for _ in answer.iter_raw():
                streaming.set()
    except httpx.HTTPError:
        pass


# -- the install script's URL ---------------------------------------------------------------------

HOSTILE = [
    "evil'$(touch PWNED)",
    "evil`touch PWNED`",
    'evil"x',
    "evil x",
    "evil;touch PWNED",
    "evil$HOME",
    "evil:99999",
    "evil:0",
    "[::1",
    "[zz::1]:80",
    "evil\\x",
    "evil/..",
    "-evil",
]


def _install_raw(server: ReefServer, host: str, query: str = "adapter=claude") -> tuple[int, bytes]:
    head = (
        f"GET /reef/harness/install?{query} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    ).encode()
    with _connect(server, head) as sock:
        received, _ = _until_closed(sock, 10)
    status = int(received.split(b" ", 2)[1]) if received.startswith(b"HTTP/1.1 ") else 0
    return status, received


@pytest.mark.parametrize("host", HOSTILE)
def test_a_hostile_host_header_is_refused(plain: ReefServer, host: str) -> None:
    status, received = _install_raw(plain, host)
    assert status == 400, received[:300]
    assert b"#!/bin/sh" not in received


@pytest.mark.parametrize(
    "url",
    [f"http://{h}" for h in HOSTILE]
    + [f"http://h/{h}" for h in HOSTILE if h[0] != "-"]
    + [
        "http://host\n",
        "http://h/\nrm -rf ~",
        "http://h/a b",
        "ftp://h",
        "http://h//x",
        "javascript:alert(1)",
        "http://h:8900/$(id)",
        "http://h/`id`",
    ],
)
def test_a_hostile_url_parameter_is_refused(plain: ReefServer, url: str) -> None:
    answer = httpx.get(f"{plain.url}/reef/harness/install", params={"adapter": "claude", "url": url}, headers=AUTH)
    assert answer.status_code == 400, url
    assert "#!/bin/sh" not in answer.text


@pytest.mark.parametrize(
    "host, expected",
    [
        ("reef.internal:8900", "http://reef.internal:8900"),
        ("[::1]:8900", "http://[::1]:8900"),
        ("10.1.2.3", "http://10.1.2.3"),
    ],
)
def test_a_plain_host_is_baked_in_quoted(plain: ReefServer, host: str, expected: str, tmp_path: Path) -> None:
    status, received = _install_raw(plain, host)
    assert status == 200, received[:300]
    script = received.split(b"\r\n\r\n", 1)[1].decode()
    assert f"reef_url='{expected}'" in script
    done = subprocess.run(
        ["sh"],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "REEF_AGENT_DRY_RUN": "1"},
    )
    assert done.returncode == 0 and f"Reef at {expected})" in done.stdout, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_public_url_is_named_whatever_the_host(hardened: ReefServer) -> None:
    for host in ("evil.example", "evil.example:8900", "127.0.0.1"):
        status, received = _install_raw(hardened, host)
        assert status == 200, received[:300]
        assert f"reef_url='{PUBLIC_URL}'".encode() in received and b"evil" not in received
    asked = httpx.get(
        f"{hardened.url}/reef/harness/install", headers=AUTH, params={"adapter": "pi", "url": "http://10.0.0.5:8900"}
    )  # the caller's own choice
    assert asked.status_code == 200 and "reef_url='http://10.0.0.5:8900'" in asked.text


def test_public_url_must_be_a_plain_url() -> None:
    with pytest.raises(InvalidInput, match=r"public_url: .*must look like http://host"):
        load_config(None, env={}, public_url="https://reef.example.com/'$(id)'")
    assert load_config(None, env={}, public_url="https://reef.example.com/").public_url == "https://reef.example.com"


# -- rollback ---------------------------------------------------------------------------------------


def test_concurrent_rollbacks_without_expected_head_all_succeed(plain: ReefServer) -> None:
    created = httpx.post(f"{plain.url}/reef/scenarios", json={"name": "rb"}, headers=AUTH)
    assert created.status_code == 201, created.text
    start = created.json()["head"]["release_id"]

    async def rollback_all(n: int) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(base_url=plain.url, headers=AUTH, timeout=60, limits=limits) as client:
            return await asyncio.gather(
                *(client.post("/reef/scenarios/rb/rollback", json={"release_id": start}) for _ in range(n))
            )

    answers = asyncio.run(rollback_all(50))
    assert [a.status_code for a in answers] == [200] * 50, [a.text for a in answers if a.status_code != 200][:3]
    made = [a.json()["release"]["release_id"] for a in answers]
    assert len(set(made)) == 50
    chain = httpx.get(f"{plain.url}/reef/scenarios/rb/releases", headers=AUTH).json()["releases"]
    assert sorted(r["step"] for r in chain) == list(range(1, 52))  # contiguous, creation + 50
    assert len({r["release_id"] for r in chain}) == len(chain) and set(made) <= {r["release_id"] for r in chain}
    summary = httpx.get(f"{plain.url}/reef/scenarios/rb", headers=AUTH).json()
    assert summary["serving"]["release_id"] == summary["head"]["release_id"] == chain[0]["release_id"]

    stale = httpx.post(
        f"{plain.url}/reef/scenarios/rb/rollback", headers=AUTH, json={"release_id": start, "expected_head": start}
    )
    assert stale.status_code == 409  # a client that named the head it saw still learns it moved


# -- restart time -------------------------------------------------------------------------------------

SELECT = Verdict("select")


def _weights(n: int) -> Candidate:
    return Candidate(
        {"adapter_config.json": b"{}", "adapter_model.safetensors": bytes([n % 256]) * 4096 + b"%d" % n},
        ArtifactKind.WEIGHTS,
    )


def _harness(n: int) -> Candidate:
    return Candidate({"system.md": b"You are release %d." % n}, ArtifactKind.HARNESS)


def _grow(chain: ReleaseChain, releases: int, kind: Any = _harness) -> None:
    while len(chain.releases()) < releases:
        chain.publish(kind(len(chain.releases())), chain.head().release_id, verdict=SELECT)


@dataclass
class OpenCost:
    seconds: float
    git_calls: int


def _open_cost(root: Path, monkeypatch: pytest.MonkeyPatch) -> OpenCost:
    calls = []
    real_run = ArtifactStore._run

    def counted(self: ArtifactStore, args: list[str], *rest: Any, **kw: Any) -> Any:
        calls.append(args[0])
        return real_run(self, args, *rest, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(ArtifactStore, "_run", counted)
        best = float("inf")
        for _ in range(3):
            calls.clear()
            start = time.perf_counter()
            ReefState.open(root).close()
            best = min(best, time.perf_counter() - start)
    return OpenCost(best, len(calls))


def _lfs_object(state: ReefState, release: Release) -> Path:
    blobs, pointers = state.artifacts._read(release.release_id)  # noqa: SLF001
    ((oid, _),) = pointers.values()
    return state.artifacts.lfs_path(oid)


def test_opening_the_state_does_not_slow_down_as_the_chain_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReefState.open(tmp_path) as state:
        chain = state.create("s", "sao")
        _grow(chain, 3, _weights)
        by_step = {r.step: r for r in chain.releases()}
        corrupted, missing = by_step[2], by_step[3]  # old, once the chain has grown
        _grow(chain, 10)
    small = _open_cost(tmp_path, monkeypatch)
    with ReefState.open(tmp_path) as state:
        _grow(state.chain("s"), 100)
    large = _open_cost(tmp_path, monkeypatch)
    assert large.git_calls == small.git_calls, (small, large)
    assert large.seconds < 3 * small.seconds + 0.1, (small, large)

    with ReefState.open(tmp_path) as state:  # damage two old releases: opening still works...
        lfs = _lfs_object(state, corrupted)
        lfs.write_bytes(b"\0" * lfs.stat().st_size)  # same size: only reading the bytes can tell
        _lfs_object(state, missing).unlink()
    with ReefState.open(tmp_path) as state:
        chain = state.chain("s")
        head = chain.head()
        with pytest.raises(Corruption, match=corrupted.release_id):  # ...but their content is never served
            chain.rollback(corrupted.release_id, None)
        with pytest.raises(MissingArtifact, match=missing.release_id):
            chain.rollback(missing.release_id, None)
        assert chain.head() == head and chain.last_step() == 100
        with pytest.raises(MissingArtifact, match=missing.release_id):
            state.verify_artifacts()
    inspected = CliRunner().invoke(main, ["inspect", "--state-dir", str(tmp_path)])
    assert inspected.exit_code == 1 and missing.release_id in inspected.output
