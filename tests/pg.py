"""A throwaway PostgreSQL cluster for tests: `postgres_dsn` (session-scoped fixture).

Import the fixture into a test module (`from pg import postgres_dsn`). It runs initdb and
postgres from /usr/local/bin (or $REEF_PG_BIN) as the `postgres` user when the tests run as
root (PostgreSQL refuses root), listens only on 127.0.0.1 on a free port with its socket in
a temporary directory, keeps `fsync=on`, and at the end of the session stops the cluster
(`pg_ctl stop -m immediate`) and deletes it. The server is started as a child with a
parent-death signal, so a test run that is killed does not leave it running; directories
of such runs are removed by the next run. Without the binaries or psycopg the tests skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

PG_BIN = Path(os.environ.get("REEF_PG_BIN", "/usr/local/bin"))
RUN_AS = "postgres"
PREFIX = "reef-pg-"
START_TIMEOUT_S = 60.0


def _missing() -> str | None:
    """Why the cluster cannot start here, or None."""
    for tool in ("initdb", "pg_ctl", "postgres"):
        if not (PG_BIN / tool).exists():
            return f"PostgreSQL binaries not found: no {PG_BIN / tool} (set REEF_PG_BIN)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]==3.3.9')"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing: cannot start PostgreSQL as its own user"
    return None


def _as_owner(args: list[str], *, die_with_parent: bool = False) -> list[str]:
    """`args` run as the postgres user when we are root (PostgreSQL refuses to run as root)."""
    wrap = ["setpriv"]
    if os.geteuid() == 0:
        wrap += [f"--reuid={RUN_AS}", f"--regid={RUN_AS}", "--init-groups"]
    if die_with_parent:
        wrap.append("--pdeathsig=KILL")
    return [*wrap, "--", *args]


def _run(args: list[str]) -> None:
    done = subprocess.run(_as_owner(args), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_clusters() -> None:
    """Delete the directories of killed runs: their postmaster is gone (or never started, long ago)."""
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        pid_file = root / "data" / "postmaster.pid"
        try:
            if pid_file.exists():  # a fresh one may be initdb's passing backend, in another test process
                young = time.time() - pid_file.stat().st_mtime < 300
                stale = not young and not _alive(int(pid_file.read_text().split()[0]))
            else:
                stale = time.time() - root.stat().st_mtime > 3600
        except (OSError, ValueError, IndexError):
            continue
        if stale:
            shutil.rmtree(root, ignore_errors=True)


def _make_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    if os.geteuid() == 0:
        shutil.chown(root, RUN_AS, RUN_AS)
    root.chmod(0o700)
    return root


def _launch(root: Path, data: Path, port: int) -> subprocess.Popen[bytes]:
    args = [str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1"]
    args += ["-c", f"unix_socket_directories={root}", "-c", "fsync=on"]
    with open(root / "server.log", "ab") as log:
        return subprocess.Popen(_as_owner(args, die_with_parent=True), stdout=log, stderr=subprocess.STDOUT)


def _wait_ready(server: subprocess.Popen[bytes], dsn: str) -> bool:
    """Poll until the server takes connections (True) or has exited (False)."""
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and server.poll() is None:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            time.sleep(0.05)
    return False


def _start(root: Path, data: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server on a free port; a port taken between choosing and binding is retried."""
    for _ in range(5):
        port = _free_port()
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        server = _launch(root, data, port)
        if _wait_ready(server, dsn):
            return server, dsn
        _stop(server, data)
    log = (root / "server.log").read_text(errors="replace")
    raise RuntimeError(f"PostgreSQL did not start:\n{log[-4000:]}")


def _stop(server: subprocess.Popen[bytes], data: Path) -> None:
    if server.poll() is None:
        subprocess.run(
            _as_owner([str(PG_BIN / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate", "-w"]),
            capture_output=True,
            timeout=60,
        )
    if server.poll() is None:
        server.kill()
    server.wait(timeout=30)


def init_cluster(data: Path) -> None:
    """A new, empty cluster in `data`: trust auth, UTF-8, no fsync (a throwaway server)."""
    _run(
        [
            str(PG_BIN / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]
    )


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    _remove_stale_clusters()
    root = _make_root()
    data = root / "data"
    try:
        init_cluster(data)
        server, dsn = _start(root, data)
        try:
            yield dsn
        finally:
            _stop(server, data)
    finally:
        shutil.rmtree(root, ignore_errors=True)
