"""What the offline commands share (`reef inspect`, `log`, `export`, `compact`): the state
directory's option, the PostgreSQL store's, and opening both for reading beside a running server."""

from __future__ import annotations

from pathlib import Path

import click

from reef.commit.state import ReefState
from reef.core.errors import ReefError

STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".reef"),
    show_default=True,
    envvar="REEF_STATE_DIR",
    help="Reef's state directory (records, commit logs, artifacts).",
)

STORE = click.option(
    "--store",
    "store_dsn",
    envvar="REEF_STORE",
    metavar="DSN",
    help="The experience store, when the server keeps it in PostgreSQL: the same "
    "postgresql:// DSN as its `store:` setting (REEF_STORE). Default: the SQLite "
    "store in the state directory.",
)


def open_state(state_dir: Path, store_dsn: str | None, artifacts_remote: str | None = None) -> ReefState:
    if not state_dir.is_dir():
        raise click.ClickException(f"no state directory at {state_dir}")
    store = None
    if store_dsn and store_dsn != "sqlite":
        if not store_dsn.startswith(("postgresql://", "postgres://")):
            raise click.ClickException("--store must be a postgresql:// DSN (or 'sqlite')")
        from reef.extras import require

        try:
            require("--store postgresql:// (the PostgreSQL store)", "postgres")
        except ReefError as exc:
            raise click.ClickException(str(exc)) from None
        from reef.observe.postgres_store import PostgresStore

        store = PostgresStore(store_dsn)
    elif not (state_dir / "experience.db").is_file():
        raise click.ClickException(
            f"no experience store at {state_dir / 'experience.db'} (a PostgreSQL store is named with --store)"
        )
    return ReefState.open(state_dir, store=store, artifacts_remote=artifacts_remote)
