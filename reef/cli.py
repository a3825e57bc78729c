"""The `reef` command. Serving commands arrive with the front door; today it inspects a
state directory offline (recovery runs as it opens, so `reef inspect` is also a check)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from reef import __version__
from reef.commit.state import ReefState
from reef.core.errors import ReefError

STATE_DIR = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".reef"), show_default=True,
    envvar="REEF_STATE_DIR", help="Reef's state directory (records, commit logs, artifacts).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reef")
def main() -> None:
    """Reef: an inference server that learns while it serves."""


@main.command()
@STATE_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def inspect(state_dir: Path, as_json: bool) -> None:
    """Open a state directory (running recovery) and show every scenario's head.

    Exits 1 with the file and line when the state is damaged, or with the release id when an
    artifact the commit log names is missing.
    """
    if not state_dir.exists():
        raise click.ClickException(f"no state directory at {state_dir}")
    try:
        with ReefState.open(state_dir) as state:
            rows = [_scenario_row(state, name) for name in state.scenarios()]
    except ReefError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        click.echo()
        return
    if not rows:
        click.echo(f"{state_dir}: no scenarios yet")
    for row in rows:
        click.echo(
            f"{row['scenario']}: step {row['step']}, head {row['release_id'][:12]} ({row['operation']}), "
            f"recipe {row['recipe']}, {row['records']} records, {row['reports']} reports"
            + (f", open batch {row['open_batch']}" if row["open_batch"] else "")
        )


@main.command()
@STATE_DIR
@click.argument("scenario")
def log(state_dir: Path, scenario: str) -> None:
    """Print a scenario's commit log, one step a line (JSON lines)."""
    try:
        with ReefState.open(state_dir) as state:
            for entry in state.chain(scenario).history():
                click.echo(json.dumps(entry.to_json(), sort_keys=True))
    except ReefError as exc:
        raise click.ClickException(str(exc)) from None


def _scenario_row(state: ReefState, name: str) -> dict:
    chain = state.chain(name)
    head = chain.head()
    batch = chain.open_batch()
    return {
        "scenario": name,
        "step": chain.last_step(),
        "release_id": head.release_id,
        "content_id": head.content_id,
        "operation": head.operation.value,
        "recipe": chain.binding["recipe"],
        "records": state.store.count_records(name),
        "reports": state.store.count_reports(name),
        "open_batch": batch["batch_id"] if batch else None,
    }
