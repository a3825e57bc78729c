"""The `reef` command: `serve` runs the server; `report`, `scenarios`, `releases`, `rollback`,
`harness`, `diff`, `promote` and `status` talk to a running server (`--url`, `--token`, or REEF_URL / REEF_TOKEN);
`inspect`, `log` and `export` read a state directory offline (recovery runs as it opens, so `reef
inspect` is also a check)."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from reef import __version__
from reef.cli_state import STATE_DIR, open_state
from reef.commit.archive import archived_scenarios
from reef.commit.state import ReefState
from reef.core.errors import ReefError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reef")
def main() -> None:
    """Reef: an inference server that learns while it serves."""


@main.command()
@STATE_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--store",
    "store_dsn",
    envvar="REEF_STORE",
    metavar="DSN",
    help="A front end on PostgreSQL: the postgresql:// DSN of its `store:` setting (REEF_STORE); "
    "the commit logs are read from there. Default: the SQLite store in the state directory.",
)
@click.option(
    "--artifacts-remote",
    envvar="REEF_ARTIFACTS__REMOTE",
    metavar="REMOTE",
    help="The shared artifact remote (`artifacts.remote`) to fetch releases other front ends published.",
)
def inspect(state_dir: Path, as_json: bool, store_dsn: str | None, artifacts_remote: str | None) -> None:
    """Open a state directory (running recovery) and show every scenario's head.

    Exits 1 with the file and line when the state is damaged, or with the release id when an
    artifact the commit log names is missing (every release is checked, not only the heads).
    Says which stale git locks (left by a git killed mid-update) recovery removed, and which
    lock files are still there (on standard error with --json).

    \b
    Examples:
      reef inspect --state-dir .reef
      reef inspect --state-dir /srv/reef --store postgresql://reef@db/reef --artifacts-remote /srv/artifacts.git
    """
    if not state_dir.exists():
        raise click.ClickException(f"no state directory at {state_dir}")
    try:
        with open_state(state_dir, store_dsn, artifacts_remote) as state:
            state.verify_artifacts()
            rows = [_scenario_row(state, name) for name in state.scenarios()]
            archived = [_archived_row(state, gone) for gone in archived_scenarios(state)]
            cleared, left = state.artifacts.cleared_locks, state.artifacts.leftover_locks()
    except ReefError as exc:
        raise click.ClickException(str(exc)) from None
    for lock in cleared:
        click.echo(f"removed a stale git lock {lock.path} ({lock.age_s:.0f} s old, left by a killed git)", err=as_json)
    for path in left:
        click.echo(
            f"git lock {path} is still there: a git is running on this state directory, or was killed "
            "moving a ref Reef does not own; remove it once no git runs",
            err=as_json,
        )
    if as_json:
        json.dump(rows + archived, sys.stdout, indent=2)
        click.echo()
        return
    if not rows:
        click.echo(f"{state_dir}: no scenarios yet")
    for row in rows:
        click.echo(
            f"{row['scenario']}: step {row['step']}, head {row['release_id'][:12]} ({row['operation']}), "
            f"recipe {row['recipe']}, {row['records']} records, {row['reports']} reports"
            + (f", open batch {', '.join(row['open_batches'])}" if row["open_batches"] else "")
            + ", {releases} release(s): weights {weights_bytes} B, optimiser {optimiser_bytes} B, "
            "shared {shared_bytes} B".format(**row["sizes"])
        )
    for row in archived:
        click.echo(
            f"archived: {row['scenario']} as {row['archived_as']} ({row['archived_at']}), "
            f"{row['steps']} step(s), {row['records']} records, {row['reports']} reports"
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


def _archived_row(state: ReefState, gone: Any) -> dict:
    """An archived scenario (reef/commit/archive.py): its records and reports are kept under its archived name."""
    return {
        **gone.to_json(),
        "archived": True,
        "records": state.store.count_records(gone.archived_as),
        "reports": state.store.count_reports(gone.archived_as),
    }


def _scenario_row(state: ReefState, name: str) -> dict:
    chain = state.chain(name)
    head = chain.head()
    batches = [b["batch_id"] for b in chain.open_batches()]
    return {
        "scenario": name,
        "step": chain.last_step(),
        "release_id": head.release_id,
        "content_id": head.content_id,
        "operation": head.operation.value,
        "recipe": chain.binding["recipe"],
        "records": state.store.count_records(name),
        "reports": state.store.count_reports(name),
        "open_batch": batches[0] if batches else None,  # the oldest
        "open_batches": batches,
        "sizes": scenario_sizes(state, name),  # bytes the artifact store keeps (reef compact frees some)
    }


# -- the server ----------------------------------------------------------------------------


@main.command()
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="YAML settings (see docs/configuration.md); environment and flags override it.",
)
@click.option("--host", help="Address to listen on  [default: 127.0.0.1]")
@click.option("--port", type=int, help="Port to listen on  [default: 8900]")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), help="State directory  [default: .reef]")
@click.option(
    "--token", "tokens", multiple=True, help="Accepted bearer token (repeat for rotation). Prefer REEF_TOKEN."
)
@click.option("--insecure", is_flag=True, default=None, help="Allow a non-loopback address without a token.")
@click.option(
    "--runtime",
    type=click.Choice(["embedded", "upstream", "vllm", "sglang"]),
    help="Default: upstream when a URL is set. vllm: a vLLM server Reef starts; sglang: the SGLang "
    "server at sglang.url (docs/engines.md).",
)
@click.option("--upstream-url", help="OpenAI- or Anthropic-compatible provider base URL (REEF_UPSTREAM_URL).")
@click.option("--upstream-model", help="Model sent upstream (REEF_UPSTREAM_MODEL).")
@click.option("--upstream-dialect", type=click.Choice(["openai", "anthropic"]), help="The provider's API.")
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Embedded, vLLM or SGLang runtime: a transformers model folder instead of SmolLM2.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), help="text: key=value lines; json: one object a line."
)
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Processes behind the one port, sharing the state directory or a postgresql:// store (docs/deploy.md).",
)
@click.option(
    "--worker-of",
    hidden=True,
    help="Internal: INDEX:SOCKET_FD:READY_FD:SUPERVISOR_PID, a worker of `--workers` (reef/serve/worker.py).",
)
def serve(
    config_path: Path | None,
    host: str | None,
    port: int | None,
    state_dir: Path | None,
    tokens: tuple[str, ...],
    insecure: bool | None,
    runtime: str | None,
    upstream_url: str | None,
    upstream_model: str | None,
    upstream_dialect: str | None,
    model_dir: Path | None,
    log_level: str | None,
    log_format: str | None,
    workers: int = 1,
    worker_of: str | None = None,
) -> None:
    """Serve OpenAI- and Anthropic-compatible requests, record them, take reports.

    With no upstream configured it serves the embedded SmolLM2-135M-Instruct on the CPU,
    fetching and converting its weights once (about a minute the first time).

    \b
    Examples:
      reef serve
      REEF_TOKEN=secret reef serve --host 0.0.0.0
      REEF_UPSTREAM_API_KEY=sk-... reef serve --upstream-url https://api.openai.com/v1 --upstream-model gpt-4o-mini
      reef serve -c reef.yaml --workers 4      # four processes on one port and one state directory
    """
    import uvicorn

    from reef.config import load_config
    from reef.runtimes.factory import build_runtime
    from reef.serve import logs
    from reef.serve.app import create_app
    from reef.serve.connection_timeouts import timed_protocol
    from reef.serve.first_steps import when_ready
    from reef.serve.recipe_choice import learning_lines

    worker = None
    try:
        if worker_of is not None:
            from reef.serve.worker import become_worker

            worker = become_worker(worker_of)  # first: it dies with its supervisor from here on
        config = load_config(
            config_path,
            host=host,
            port=port,
            state_dir=state_dir,
            tokens=list(tokens) or None,
            insecure=insecure,
            runtime=runtime,
            upstream__url=upstream_url,
            upstream__model=upstream_model,
            upstream__dialect=upstream_dialect,
            embedded__model_dir=model_dir,
            log_level=log_level,
            log_format=log_format,
        )
        handler = logs.configure(config.log_level, config.log_format)  # Reef's, uvicorn's and every library's lines
        say = logs.announcer(config.log_format, handler)
        config.check_exposure()
        if workers > 1 and worker_of is None:
            from reef.serve.workers import supervise

            sys.exit(supervise(config, workers, say))
        if worker is not None:
            from reef.serve.workers import worker_config

            config = worker_config(config, worker.index)
        _check_install(config)  # git, and the extras the settings need, before a minute of model loading
        _check_shared_artifacts(config)
        _check_gate(config)
        built = build_runtime(config, progress=say)
        app = create_app(config, built, on_ready=when_ready(config, built, say) if worker is None else None)
    except (ReefError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    auth = f"{len(config.tokens)} token(s)" if config.tokens else "no token (loopback only)"
    say(f"serving {built.name} runtime on http://{config.host}:{config.port} (state {config.state_dir}, auth: {auth})")
    for line in learning_lines(config, built):
        say(line)
    settings = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        log_config=None,  # uvicorn's lines go through the handler `logs.configure` set
        http=timed_protocol(config.header_timeout, config.body_timeout, config.limits.max_header_bytes),
        ws="none",  # Reef serves no websockets, and the timed protocol hands no upgrade over
        timeout_keep_alive=config.keep_alive_timeout,  # type: ignore[arg-type]  # a float works
        timeout_graceful_shutdown=config.shutdown_timeout,
    )  # type: ignore[arg-type]
    if worker is None:
        server = uvicorn.Server(settings)
        server.run()
    else:  # the supervisor's listening socket; READY on its pipe once serving
        from reef.serve.worker import WorkerServer

        server = WorkerServer(settings, worker.ready_fd)
        server.run(sockets=[worker.listening_socket()])
    if not server.started:  # e.g. the port is taken (uvicorn logged why)
        sys.exit(3)


if TYPE_CHECKING:
    from reef.config import ServeConfig


def _check_install(config: ServeConfig) -> None:
    """What `reef serve` needs beyond the core, checked before anything starts: git, and the
    extras the settings ask for (each missing one named with the pip command that installs it)."""
    from reef.commit.artifacts import require_git
    from reef.extras import require
    from reef.runtimes.factory import require_embedded

    require_git()
    if config.store != "sqlite":
        require("a postgresql:// store (the PostgreSQL experience store)", "postgres")
    if config.runtime_kind == "embedded":
        require_embedded(config)


def _check_shared_artifacts(config: ServeConfig) -> None:
    """On PostgreSQL every front end follows releases others publish, and reads their content
    from the artifact remote: without one, a release published elsewhere could not be served here.
    `--workers` makes its own remote (its workers are given it), so only a lone front end is refused."""
    from reef.serve.workers import on_postgres

    if on_postgres(config) and not (config.artifacts.remote or "").strip():
        raise ReefError(
            "refusing to serve a postgresql:// store without artifacts.remote: front ends on one "
            "database share releases, and this one could not read the content of those another "
            "publishes; set artifacts.remote to a git URL or bare repository every front end reaches "
            "(docs/deploy.md), or serve this machine's front ends with --workers, which makes one"
        )


def _check_gate(config: ServeConfig) -> None:
    """The weights gate's tasks file and scorer, read before serving: a mistake there would
    otherwise surface only when a scenario's learner first builds its gate."""
    from reef.commit.gate import load_gate_tasks

    if config.learner.enabled:
        load_gate_tasks(config.learner.gate)


# -- talking to a running server -------------------------------------------------------------

# the options and the call of every client command: one copy, in the commands' own module
from reef.cli_train import (  # noqa: E402
    TOKEN,
    URL,
    _print,  # noqa: E402
)
from reef.cli_train import _call as _client_call  # noqa: E402


@main.command()
@URL
@TOKEN
@click.argument("receipts", nargs=-1)
@click.option("--score", type=float, required=True, help="A finite number; higher is better.")
@click.option("--feedback", help="What was right or wrong, in words.")
@click.option("--session", help="Report on every record of this session instead of receipts.")
@click.option("--scenario", help="Scenario of the session (default: default).")
def report(
    url: str,
    token: str | None,
    receipts: tuple[str, ...],
    score: float,
    feedback: str | None,
    session: str | None,
    scenario: str | None,
) -> None:
    """Score one or more receipts (x-reef-agent-record-id), or a whole session.

    \b
    Examples:
      reef report 4f0c...e1 --score 1
      reef report 4f0c...e1 --score 0 --feedback "missed the empty-token case"
      reef report --session 1c9b --score 0.5
    """
    if not receipts and not session:
        raise click.UsageError("name at least one receipt, or --session")
    _print(
        _client_call(
            url,
            token,
            lambda c: c.report(*receipts, score=score, feedback=feedback, session=session, scenario=scenario),
        )
    )


@main.command()
@URL
@TOKEN
def scenarios(url: str, token: str | None) -> None:
    """List scenarios: recipe, head release, step, record and report counts."""
    rows = _client_call(url, token, lambda c: c.scenarios())
    if not rows:
        click.echo("no scenarios yet (the first request creates one)")
    for row in rows:
        click.echo(
            f"{row['name']}: recipe {row['recipe']}, step {row['step']}, head {row['head']['release_id'][:12]} "
            f"({row['head']['operation']}), {row['records']} records, {row['reports']} reports"
        )


@main.command()
@URL
@TOKEN
@click.argument("scenario")
def releases(url: str, token: str | None, scenario: str) -> None:
    """List a scenario's releases, newest first (* marks the head)."""
    data = _client_call(url, token, lambda c: c.releases(scenario))
    for r in data["releases"]:
        mark = "*" if r["current"] else " "
        verdict = (r.get("verdict") or {}).get("decision", "-")
        click.echo(
            f"{mark} step {r['step']:>4}  {r['release_id']}  {r['operation']:<9} verdict {verdict}"
            + ("  (pending review)" if r["pending"] else "")
        )


@main.command()
@URL
@TOKEN
@click.argument("scenario")
@click.argument("release_id")
def rollback(url: str, token: str | None, scenario: str, release_id: str) -> None:
    """Serve an earlier release's content again, published as a new release (history is kept)."""
    data = _client_call(url, token, lambda c: c.rollback(scenario, release_id))
    click.echo(
        f"step {data['release']['step']}: {data['release']['release_id']} now serves the content of {release_id}"
    )


@main.command()
@URL
@TOKEN
@click.argument("scenario", required=False)
@click.option("--release-id", help="A release of the scenario's chain  [default: the serving release]")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the tree into this folder (system.md, rules/, skills/, ...); harness files the "
    "release lacks are removed from it, other files stay.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole answer as JSON.")
def harness(
    url: str, token: str | None, scenario: str | None, release_id: str | None, out: Path | None, as_json: bool
) -> None:
    """Show or fetch a scenario's harness: system prompt, rules and skills.

    SCENARIO defaults to `default`. Without --out it prints the release, the files and the
    system prompt inject mode would add (before any skill body); with --out it writes the tree.

    \b
    Examples:
      reef harness coding
      reef harness coding --out ./harness
      reef harness coding --release-id 3f2a...9c --json
    """
    from reef.surfaces.harness import PREFIX, HarnessTree

    data = _client_call(url, token, lambda c: c.harness(scenario, release_id))
    if as_json:
        _print(data)
    if out is not None:
        files = {PREFIX + p: t.encode() for p, t in data["files"].items()}
        files.update({PREFIX + p: base64.b64decode(b) for p, b in data.get("binary_files", {}).items()})
        try:
            HarnessTree.from_files(files).write_dir(out, prune=True)
        except (ReefError, OSError) as exc:
            raise click.ClickException(f"cannot write {out}: {exc}") from None
        click.echo(f"wrote {len(files)} file(s) of release {data['release_id']} to {out}", err=as_json)
    if as_json or out is not None:
        return
    click.echo(f"scenario {data['scenario']}, release {data['release_id']} ({data['mode']} mode)")
    click.echo(f"content {data['content_id']}")
    for path in sorted({**data["files"], **data.get("binary_files", {})}):
        click.echo(f"  {path}")
    if not data["files"] and not data.get("binary_files"):
        click.echo("  (no harness)")
    if data["system_prompt"]:
        click.echo("\n" + data["system_prompt"])


@main.command()
@URL
@TOKEN
@click.argument("scenario")
@click.argument("release_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (changed paths and the diff) instead of the diff.")
def diff(url: str, token: str | None, scenario: str, release_id: str, as_json: bool) -> None:
    """Show what a release changed against its parent, as a unified diff.

    \b
    Examples:
      reef diff coding 3f2a...9c
      reef diff coding 3f2a...9c --json
    """
    data = _client_call(url, token, lambda c: c.diff(scenario, release_id))
    if as_json:
        _print(data)
        return
    parent = data["parent_release_id"] or "nothing (the scenario's creation)"
    click.echo(
        f"release {data['release_id']} ({data['operation']}) against {parent}: {len(data['changed'])} file(s) changed",
        err=True,
    )
    click.echo(data["diff"], nl=False)


@main.command()
@URL
@TOKEN
@click.argument("scenario")
@click.argument("release_id")
@click.option("--expected-head", help="Refuse (409) unless this is still the head release.")
def promote(url: str, token: str | None, scenario: str, release_id: str, expected_head: str | None) -> None:
    """Publish and serve a release the gate held for review (`publish: review`).

    `reef releases SCENARIO` marks such releases "(pending review)"; `reef diff` shows what one
    would change. Promoting publishes its content as a new release (history is kept).

    \b
    Example:
      reef promote coding 3f2a...9c
    """
    data = _client_call(url, token, lambda c: c.promote(scenario, release_id, expected_head))
    click.echo(
        f"step {data['release']['step']}: {data['release']['release_id']} now serves the content of {release_id}"
    )


@main.command()
@URL
@TOKEN
def status(url: str, token: str | None) -> None:
    """Show serving, learning and storage state."""
    _print(_client_call(url, token, lambda c: c.status()))


from reef.cli_compact import compact, scenario_sizes  # noqa: E402  (a command of its own module, registered here)
from reef.cli_export import export  # noqa: E402  (a command group of its own module, registered here)
from reef.cli_import import import_records  # noqa: E402  (a command of its own module, registered here)
from reef.cli_train import config, mode, train, train_now  # noqa: E402  (commands of their own module)
from reef.demo.cli import demo  # noqa: E402  (a command of its own module, registered here)

main.add_command(compact)
main.add_command(export)
main.add_command(demo)
main.add_command(import_records)
for command in (train, train_now, mode, config):
    main.add_command(command)
