"""A throwaway PostgreSQL cluster that can be stopped and started again on its port, for
benchmarks that take the database away under a running Reef (tests/pg.py's fixture starts one
per test session and keeps it up; this reuses its pieces).

    cluster = PgCluster().start()
    dsn = cluster.create_database("reef_bench")   # postgresql://postgres@127.0.0.1:PORT/reef_bench
    cluster.stop("immediate"); cluster.start()    # same port, same data
    cluster.close()                               # stops it and deletes its directory

Start and restart it from the main thread: the server dies with the thread that started it
(tests/pg.py's parent-death signal), so a killed benchmark leaves nothing running.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.pg import (
    PG_BIN,
    _as_owner,
    _free_port,
    _launch,
    _make_root,
    _missing,
    _remove_stale_clusters,
    _stop,
    _wait_ready,
    init_cluster,
)


class PgCluster:
    def __init__(self) -> None:
        reason = _missing()
        if reason is not None:
            raise RuntimeError(reason)
        _remove_stale_clusters()
        self.root: Path = _make_root()
        self.data = self.root / "data"
        self.port = _free_port()
        self.server: subprocess.Popen[bytes] | None = None
        init_cluster(self.data)

    @property
    def dsn(self) -> str:
        """The libpq key=value DSN of the `postgres` database."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def running(self) -> bool:
        return self.server is not None and self.server.poll() is None

    def start(self) -> PgCluster:
        """Start the server on its port (again, after `stop`); waits until it takes connections."""
        if self.running:
            return self
        self.server = _launch(self.root, self.data, self.port)
        if not _wait_ready(self.server, self.dsn):
            _stop(self.server, self.data)
            log = (self.root / "server.log").read_text(errors="replace")
            raise RuntimeError(f"PostgreSQL did not start on port {self.port}:\n{log[-4000:]}")
        return self

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m MODE`: fast (disconnects clients, clean shutdown) or immediate (a crash:
        recovery replays the WAL at the next start)."""
        if self.server is None or self.server.poll() is not None:
            return
        subprocess.run(
            _as_owner([str(PG_BIN / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w"]),
            check=False,
            capture_output=True,
            timeout=60,
        )
        if self.server.poll() is None:
            self.server.kill()
        self.server.wait(timeout=30)

    def create_database(self, name: str) -> str:
        """Create database `name`; its postgresql:// URL."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def close(self) -> None:
        if self.server is not None:
            _stop(self.server, self.data)
        shutil.rmtree(self.root, ignore_errors=True)
