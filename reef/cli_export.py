"""`reef export records` and `reef export release`: experience and releases out of a state
directory, read offline like `reef inspect` (docs/export.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from reef.cli_state import STATE_DIR, STORE, open_state
from reef.core.errors import ReefError


@click.group()
def export() -> None:
    """Take experience or a release out of Reef: records as a chat dataset (JSONL), a release
    as a PEFT adapter folder and/or a harness tree.

    Both read the state directory offline, like `reef inspect`: they work whether or not the
    server runs (SQLite's WAL lets them read beside it) and need no token.
    """


@export.command("records")
@STATE_DIR
@STORE
@click.argument("scenario")
@click.option(
    "--out",
    "out_path",
    default="-",
    show_default=True,
    metavar="FILE|-",
    help="Where to write the JSONL; '-' is standard output. A file is written whole or not at all; "
    "a symbolic link or a device (/dev/stdout) is refused, never replaced.",
)
@click.option("--release", "release_id", metavar="ID", help="Only records served by this release (id or prefix).")
@click.option("--min-score", type=float, help="Only records whose score (mean of their reports) is at least this.")
@click.option("--max-score", type=float, help="Only records whose score (mean of their reports) is at most this.")
@click.option(
    "--since",
    metavar="TIME",
    help="Only records stored at or after TIME (ISO 8601, UTC unless it says otherwise, or epoch seconds).",
)
@click.option("--until", metavar="TIME", help="Only records stored before TIME.")
@click.option(
    "--status",
    type=click.Choice(["complete", "incomplete", "any"]),
    default="complete",
    show_default=True,
    help="Which records: finished normally, ended by an error (partial answers), or all (in progress too).",
)
@click.option("--reported-only", is_flag=True, help="Only records some report scored.")
@click.option(
    "--client-messages",
    is_flag=True,
    help="Export the client's own messages, without the harness inject mode put in front.",
)
def export_records(
    state_dir: Path,
    store_dsn: str | None,
    scenario: str,
    out_path: str,
    release_id: str | None,
    min_score: float | None,
    max_score: float | None,
    since: str | None,
    until: str | None,
    status: str,
    reported_only: bool,
    client_messages: bool,
) -> None:
    """Write a scenario's records as JSONL in chat format, one record a line.

    Each line: {"messages": [the request in OpenAI chat format, then the assistant's answer],
    "tools": [...] (when offered), "score": mean report score or null, "scores": [...],
    "feedback": [...], "metadata": {"record_id", "scenario", "release_id", "session", "tags",
    "created_at", "status"}}. `datasets.load_dataset("json", data_files=FILE)` reads it.
    Records are streamed in the order they were stored, so memory stays flat.

    \b
    Examples:
      reef export records default --out default.jsonl
      reef export records coding --min-score 1 --since 2026-05-01 --out good.jsonl
      reef export records coding --store postgresql://reef@db/reef --release 3f2a9c | jq .score
    """
    from reef.core.types import RecordStatus
    from reef.observe.export import (
        RecordFilters,
        examples,
        parse_time,
        refuse_link_or_special,
        write_jsonl,
        write_jsonl_file,
    )

    statuses = None if status == "any" else {RecordStatus(status)}
    out_file = None if out_path == "-" else Path(out_path)
    try:
        if out_file is not None:
            refuse_link_or_special(out_file)  # before any work: `--out /dev/stdout` is refused at once
        filters = RecordFilters(
            statuses=statuses,
            since=parse_time(since) if since else None,
            until=parse_time(until) if until else None,
            min_score=min_score,
            max_score=max_score,
            reported_only=reported_only,
        )
        with open_state(state_dir, store_dsn) as state:
            state.chain(scenario)  # NotFound for an unknown scenario
            if release_id:
                from dataclasses import replace

                from reef.commit.export import resolve_release

                filters = replace(filters, release_id=resolve_release(state, scenario, release_id).release_id)
            request_of = None
            if client_messages:
                from reef.surfaces.inject import client_request

                request_of = lambda record: client_request(record.request, record.harness)  # noqa: E731
            rows = examples(state.store, scenario, filters, request_of)
            count = write_jsonl(sys.stdout, rows) if out_file is None else write_jsonl_file(out_file, rows)
    except (ReefError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"exported {count} record(s) of scenario {scenario}" + (f" to {out_file}" if out_file else ""), err=True)


@export.command("release")
@STATE_DIR
@STORE
@click.argument("scenario")
@click.argument("release_id")
@click.argument("dest", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Write into DIR even if it is not empty (our files are overwritten).")
@click.option("--base-model", help="Set adapter_config.json's base_model_name_or_path to this name or path.")
@click.option("--only", type=click.Choice(["adapter", "harness"]), help="Write only this part of the release.")
def export_release(
    state_dir: Path,
    store_dsn: str | None,
    scenario: str,
    release_id: str,
    dest: Path,
    force: bool,
    base_model: str | None,
    only: str | None,
) -> None:
    """Write a release's LoRA adapter as a PEFT folder and/or its harness as files under DIR/harness/.

    DIR gets adapter_config.json and adapter_model.safetensors, loadable by
    `peft.PeftModel.from_pretrained(base, DIR)` and by vLLM (`LoRARequest(name, 1, DIR)`);
    base_model_name_or_path names the base model (HuggingFaceTB/SmolLM2-135M-Instruct for the
    embedded model; --base-model to say otherwise). DIR/reef-export.json records the scenario,
    release and content id. RELEASE_ID may be a prefix (`reef releases` lists them).

    \b
    Examples:
      reef export release coding 3f2a9c ./coding-adapter
      reef export release coding 3f2a9c ./coding-harness --only harness --force
    """
    from reef.commit.export import PARTS
    from reef.commit.export import export_release as write_release

    try:
        with open_state(state_dir, store_dsn) as state:
            done = write_release(
                state, scenario, release_id, dest, force=force, base_model=base_model, parts=(only,) if only else PARTS
            )
    except (ReefError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    what = []
    if done.adapter_files:
        what.append(f"adapter ({', '.join(done.adapter_files)}; base model {done.base_model})")
    if done.harness_files:
        what.append(f"harness ({len(done.harness_files)} file(s) under {dest / 'harness'})")
    click.echo(
        f"release {done.release.release_id} (step {done.release.step}) of {scenario} -> {dest}: " + "; ".join(what)
    )
