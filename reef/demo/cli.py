"""`reef demo`: registered in reef/cli.py with `main.add_command(demo)`."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.option(
    "--minutes",
    type=click.FloatRange(min=0.05),
    default=15.0,
    show_default=True,
    help="How long to send traffic (after the server is up); a verdict of the gate under way then keeps "
    "it going until the verdict lands (at most 4 minutes more), so what the traffic trained is published "
    "while it runs.",
)
@click.option(
    "--concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="Requests kept in flight at once."
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reef-demo"),
    show_default=True,
    help="Where learning_curve.png, learning_curve.json and serve.log go.",
)
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A transformers model folder instead of SmolLM2-135M-Instruct.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the demo's serve.yaml and state go  [default: a new temporary folder]",
)
@click.option(
    "--examples",
    type=click.IntRange(0, 3),
    default=None,
    help="Worked examples shown before each question (0-3)  [default: 1]",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.05, max=2.0),
    default=None,
    help="Sampling temperature of the demo's traffic (the gate answers greedily)  [default: 1.0]",
)
@click.option(
    "--lr",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="The learner's learning rate (AdamW on the LoRA adapter)  [default: 2e-4]",
)
@click.option(
    "--runtime",
    type=click.Choice(["embedded", "vllm"]),
    default="embedded",
    show_default=True,
    help="What serves the model: Reef's embedded runtime, or a vLLM Reef starts (installed into its "
    "own environment on first use, a few minutes; docs/engines.md) serving the same weights.",
)
@click.option(
    "--canary",
    type=click.FloatRange(0, 1),
    default=None,
    help="learner.canary of the demo's scenario: the fraction of requests the newest candidate under "
    "test, one the gate has not selected, serves (0: none, only published releases serve; above "
    "0.1 raises learner.canary_max_fraction with it)  [default: 0.1]",
)
@click.option(
    "--loss",
    type=click.Choice(["cispo", "ppo", "clipped_is"]),
    default=None,
    help="learner.sao.loss of the demo's learner: cispo weights every token's gradient by its "
    "truncated ratio; ppo is PPO's clipped surrogate; clipped_is masks tokens outside the clip "
    "(docs/learning.md compares them)  [default: cispo]",
)
@click.option(
    "--weights",
    type=click.Choice(["lora", "full"]),
    default="lora",
    show_default=True,
    help="learner.weights: train a LoRA adapter, or every weight of the model (full; each candidate is "
    "then a whole checkpoint, trained at learner.sao.full_lr 2e-5)",
)
@click.option(
    "--ranks",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="learner.ranks: training processes (a torchrun job with FSDP2 above 1; needs --weights full)",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the result as JSON at the end (stdout holds only that; the progress goes to stderr).",
)
def demo(
    minutes: float,
    concurrency: int,
    out_dir: Path,
    model_dir: Path | None,
    workdir: Path | None,
    examples: int | None,
    temperature: float | None,
    lr: float | None,
    runtime: str,
    canary: float | None,
    loss: str | None,
    weights: str,
    ranks: int,
    as_json: bool,
) -> None:
    """Watch Reef learn: the whole loop on the embedded model, with a live learning curve.

    Starts its own `reef serve` (SmolLM2-135M-Instruct on the CPU) and sends it one-word
    questions ("What is the plural of foot? Answer with one word.", after one worked
    example; --examples 0-3), scores each answer with a strict verifier (exact answer 1, the answer inside a short sentence 0.25, else 0; a
    truncated reply fails) and reports the score on its receipt. The learner trains LoRA
    candidates on that feedback; the gate publishes one only when it beats the serving release
    on held-out questions that traffic never asks. The demo's scenario opts in to a canary: one
    request in ten goes to the newest candidate under test, which the gate has not selected, while
    the gate judges it (--canary); once the gate's questions stop telling candidates apart, the
    line's live scores join the gate's test (learner.gate.live_split); after the first
    publication each candidate is judged on the half of the questions that did not choose the
    serving release (learner.gate.halves: after_first). Before the traffic and after it, the
    starting and the final release answer test questions that nothing is trained or selected
    on; both figures are in the summary. Ctrl-C (or SIGTERM) stops early and still writes the
    curve.

    \b
    Example:
      reef demo                          # 15 minutes, curve in ./reef-demo/
      reef demo --minutes 5 --out-dir /tmp/curve
      reef demo --runtime vllm           # the same loop, served by vLLM (CPU build)
      reef demo --weights full --ranks 2 # full weights, trained by two FSDP ranks
    """
    from reef.core.errors import ReefError
    from reef.extras import require

    try:  # the embedded model it learns on, and the table and plot it draws
        require("reef demo", "embedded", "demo")
    except ReefError as exc:
        raise click.ClickException(str(exc)) from None
    from rich.console import Console

    from reef.demo.run import run_demo
    from reef.demo.server import CANARY, LEARNING_RATE, LOSS, TRAFFIC_TEMPERATURE, DemoServerError
    from reef.demo.tasks import SHOWN_EXAMPLES

    try:  # with --json, stdout is the result alone: the progress goes to stderr
        result = run_demo(
            minutes=minutes,
            workdir=workdir,
            model_dir=model_dir,
            concurrency=concurrency,
            out_dir=out_dir,
            examples=SHOWN_EXAMPLES if examples is None else examples,
            temperature=TRAFFIC_TEMPERATURE if temperature is None else temperature,
            lr=LEARNING_RATE if lr is None else lr,
            runtime=runtime,
            canary=CANARY if canary is None else canary,
            loss=loss or LOSS,
            weights=weights,
            ranks=ranks,
            console=Console(stderr=as_json),
        )
    except DemoServerError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
