"""The demo's live view: one rich renderable, rebuilt about twice a second."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table

if TYPE_CHECKING:
    from reef.demo.run import DemoStats


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _verdict_line(decision: dict[str, Any] | None) -> str:
    if not decision:
        return "waiting for the first candidate"
    verdict = decision.get("verdict") or {}
    m = verdict.get("metrics") or {}
    line = f"step {decision.get('step', '?')}: {verdict.get('decision', '?')}"
    if m.get("candidate_success") is not None:
        line += (
            f" - held-out success {_pct(m.get('current_success'))} -> {_pct(m.get('candidate_success'))}"
            f" (wins {m.get('wins', '?')}, losses {m.get('losses', '?')}, ties {m.get('ties', '?')}, "
            f"p={m.get('p_value', float('nan')):.3f})"
        )
    return line


def _learner_line(learning: dict[str, Any], scenario: str) -> str:
    for idle in learning.get("idle") or []:
        if idle.get("scenario") == scenario:
            return f"idle: {idle.get('reason')}"
    mine = next((row for row in learning.get("learners") or [] if row.get("scenario") == scenario), None)
    if mine is None:
        return "not started yet"
    line = (
        f"{mine.get('state', '?')}, {mine.get('pending_samples', 0)} scored samples waiting, "
        f"{mine.get('candidates', 0)} candidate(s) trained"
    )
    if mine.get("last_train_seconds"):
        line += f", last training {mine['last_train_seconds']:.1f}s"
    if mine.get("last_error"):
        line += f", last error: {str(mine['last_error'])[:120]}"
    return line


def live_view(stats: DemoStats) -> Group:
    elapsed = stats.elapsed()
    published, rejected = stats.counts()
    window = stats.traffic[-48:]
    overview = Table.grid(padding=(0, 2))
    overview.add_column(style="bold")
    overview.add_column()
    if elapsed < stats.minutes:
        overview.add_row("time", f"{elapsed:.1f} of {stats.minutes:g} min ({stats.minutes - elapsed:.1f} left)")
    else:
        overview.add_row(
            "time", f"{elapsed:.1f} min: traffic goes on until the gate's verdict on the candidate it judges"
        )
    overview.add_row(
        "requests",
        f"{stats.requests} sent, {stats.in_flight} in flight, {stats.reports} reported"
        + (f", {stats.errors} errors (last: {stats.last_error})" if stats.errors else ""),
    )
    overview.add_row(
        "releases",
        f"{published} published, {rejected} rejected"
        + ("" if stats.decisions_route else " (no decisions route: rejections not shown)"),
    )
    overview.add_row(
        "live success",
        f"{_pct(sum(p['success'] for p in window) / len(window)) if window else '-'}"
        f" over the last {len(window)} answers (temperature {stats.temperature:g})",
    )
    start_test = stats.test.get("start", {}).get("success")
    if start_test is not None:
        overview.add_row(
            "test success",
            f"{_pct(start_test)} at the start (greedy, questions nothing is trained "
            "or selected on; asked again at the end)",
        )
    overview.add_row("learner", _learner_line(stats.learning, "demo"))
    overview.add_row(
        "latest verdict",
        _verdict_line(max(stats.decisions, key=lambda d: d.get("step") or 0) if stats.decisions else None),
    )
    per_release = Table(title="live traffic by serving release", title_justify="left")
    for column in ("release", "requests", "mean score", "exact success"):
        per_release.add_column(column, justify="left" if column == "release" else "right")
    for row in stats.releases():
        mark = " (start)" if row["release_id"] == stats.starting_release else ""
        per_release.add_row(
            row["release_id"][:12] + mark, str(row["requests"]), f"{row['mean_score']:.3f}", _pct(row["success_rate"])
        )
    return Group(overview, per_release)
