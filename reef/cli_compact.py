"""`reef compact`: free old releases' optimiser state in a state directory's artifact store, and
the size figures `reef inspect` shows per scenario (reef/commit/weights_store.py)."""

from __future__ import annotations

from pathlib import Path

import click

from reef.cli_state import STATE_DIR
from reef.commit.state import ReefState
from reef.commit.weights_store import compact_optimiser, size_report
from reef.core.errors import ReefError


def scenario_sizes(state: ReefState, name: str) -> dict[str, int]:
    """What the artifact store keeps for a scenario's releases, in bytes."""
    oldest_first = [r.release_id for r in reversed(state.chain(name).releases())]
    return size_report(state.artifacts, oldest_first).to_json()


@click.command()
@STATE_DIR
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Releases per scenario, the newest (the head among them), whose optimiser state stays.",
)
@click.option("--scenario", "only", help="Only this scenario (default: every one).")
def compact(state_dir: Path, keep: int, only: str | None) -> None:
    """Free the optimiser state (`training/`) of every release but each scenario's newest `--keep`.

    Weights are never freed: every release still serves and rolls back; training from a compacted
    release starts a fresh optimiser. Prints the bytes freed per scenario.

    \b
    Examples:
      reef compact --state-dir .reef
      reef compact --state-dir /srv/reef --keep 3 --scenario support
    """
    if not state_dir.is_dir():
        raise click.ClickException(f"no state directory at {state_dir}")
    try:
        with ReefState.open(state_dir) as state:
            for name in [only] if only else state.scenarios():
                chain = state.chain(name)
                with chain.log.transaction():  # no release is published meanwhile
                    oldest_first = [r.release_id for r in reversed(chain.releases())]
                    done = compact_optimiser(state.artifacts, oldest_first, keep)
                click.echo(f"{name}: freed {done.objects} optimiser object(s), {done.freed_bytes} bytes")
    except ReefError as exc:
        raise click.ClickException(str(exc)) from None
