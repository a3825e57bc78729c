"""`reef train`, `reef train-now`, `reef mode` and `reef config get|set`: instructions, training
modes and live settings of a running server (docs/http.md#training-instructions-and-modes), thin
over the Python client."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import click

from reef.client import DEFAULT_URL, ReefClient, ReefClientError

URL = click.option(
    "--url", envvar="REEF_URL", default=DEFAULT_URL, show_default=True, help="Reef's address (REEF_URL)."
)
TOKEN = click.option("--token", envvar="REEF_TOKEN", default=None, help="Bearer token (REEF_TOKEN).")
SETTLED = ("published", "rejected")


def _call(url: str, token: str | None, call: Callable[[ReefClient], Any]) -> Any:
    try:
        with ReefClient(url, token) as client:
            return call(client)
    except ReefClientError as exc:
        raise click.ClickException(str(exc)) from None


def _print(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


@click.command()
@URL
@TOKEN
@click.argument("scenario")
@click.argument("instruction")
@click.option("--reference", "references", multiple=True, help="A receipt the instruction is about (repeatable).")
@click.option("--id", "instruction_id", help="Your own receipt for it, for retry safety.")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for it to be published or rejected.")
def train(
    url: str,
    token: str | None,
    scenario: str,
    instruction: str,
    references: tuple[str, ...],
    instruction_id: str | None,
    wait: float,
) -> None:
    """Tell a scenario what to learn, in words (manual or hybrid mode; a harness recipe).

    \b
    Examples:
      reef train support "Stop apologising; answer in one line." --wait 120
    """

    def give(client: ReefClient) -> dict[str, Any]:
        answer = client.train(scenario, instruction, references, instruction_id)
        deadline = time.monotonic() + wait
        while answer["state"] not in SETTLED and time.monotonic() < deadline:
            time.sleep(1.0)
            answer = client.training(answer["instruction_id"])
        return answer

    _print(_call(url, token, give))


@click.command("train-now")
@URL
@TOKEN
@click.argument("scenario")
def train_now(url: str, token: str | None, scenario: str) -> None:
    """Ask a scenario in manual or hybrid mode for its next batch now."""
    _print(_call(url, token, lambda client: client.train_now(scenario)))


@click.command()
@URL
@TOKEN
@click.argument("scenario")
@click.argument("training_mode", type=click.Choice(["auto", "manual", "hybrid"]))
def mode(url: str, token: str | None, scenario: str, training_mode: str) -> None:
    """Set when a scenario trains: auto (from traffic), manual (instructions, train-now) or hybrid."""
    _print(_call(url, token, lambda client: client.set_training_mode(scenario, training_mode)))


@click.group()
def config() -> None:
    """A running scenario's settings: read them, change the live ones."""


@config.command("get")
@URL
@TOKEN
@click.argument("scenario")
def config_get(url: str, token: str | None, scenario: str) -> None:
    """Print the scenario's effective settings and their revision."""
    _print(_call(url, token, lambda client: client.config(scenario)))


@config.command("set")
@URL
@TOKEN
@click.argument("scenario")
@click.argument("changes", nargs=-1, required=True)
@click.option(
    "--revision", type=int, help="Change only if the settings are still at this revision (default: the one read now)."
)
def config_set(url: str, token: str | None, scenario: str, changes: tuple[str, ...], revision: int | None) -> None:
    """Change live settings: NAME=VALUE ... (lr, batch_size, gate_margin, gate_confidence,
    canary_fraction, training_mode).

    \b
    Examples:
      reef config set support batch_size=4 gate_margin=2
    """
    parsed = dict(_setting(change) for change in changes)

    def change(client: ReefClient) -> dict[str, Any]:
        at = revision if revision is not None else client.config(scenario)["revision"]
        return client.set_config(scenario, parsed, at)

    _print(_call(url, token, change))


def _setting(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise click.BadParameter(f"{text!r}: give NAME=VALUE")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value  # a word, such as a training mode
