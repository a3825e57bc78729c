"""The demo's learning curve: the figures, a PNG of them, and a table.

`curve` is a plain dict (it is also the JSON written next to the PNG):
- `heldout`: `[{minute, success, score, release_id, kind}]`, the gate's held-out success of each
  release: the starting release at minute 0 (`kind: start`), then each selected candidate at the
  minute it was published (`kind: published`);
- `rejected`: `[{minute, candidate_success, current_success, p_value}]`, candidates the gate refused;
- `traffic`: `[{minute, score, success, release_id}]`, every scored live request (train split,
  temperature 1), from which a rolling success rate is drawn;
- `releases`: `[{release_id, requests, mean_score, success_rate}]`, live traffic per release;
- `test`: `{start, final}: {release_id, n, success}`, greedy success on the test questions, which
  no request of the traffic asks and the gate never sees: asked of the starting release before
  the traffic and of the serving one after it (and after the gate's last verdict on the traffic's
  candidates; `final.minute` says when);
- `settings`: what the demo ran with (worked examples, traffic temperature, lr, minutes);
- `summary`: the demo's result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROLLING_WINDOW = 48  # live requests per point of the rolling training success rate


def rolling_success(traffic: list[dict[str, Any]], window: int = ROLLING_WINDOW) -> list[tuple[float, float]]:
    """(minute, success rate over the last `window` requests) for each request."""
    out: list[tuple[float, float]] = []
    hits: list[float] = []
    for point in sorted(traffic, key=lambda p: p["minute"]):
        hits.append(1.0 if point["success"] else 0.0)
        recent = hits[-window:]
        out.append((float(point["minute"]), sum(recent) / len(recent)))
    return out


def plot_learning_curve(curve: dict[str, Any], path: Path, window: int = ROLLING_WINDOW) -> Path:
    """Write the curve as a PNG (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    try:
        heldout = sorted(curve.get("heldout", []), key=lambda p: p["minute"])
        if heldout:
            xs = [p["minute"] for p in heldout]
            ys = [100 * p["success"] for p in heldout]
            end = max(_traffic_end(curve), _final_test_minute(curve), xs[-1])
            # A release serves until the next one replaces it: draw the held-out line as steps.
            ax.step(
                xs + [end],
                ys + [ys[-1]],
                where="post",
                color="tab:blue",
                linewidth=2,
                label="held-out success of the serving release (gate, greedy)",
            )
            ax.plot(xs, ys, "o", color="tab:blue")
        rejected = curve.get("rejected", [])
        if rejected:
            ax.plot(
                [p["minute"] for p in rejected],
                [100 * p["candidate_success"] for p in rejected],
                "x",
                color="tab:red",
                alpha=0.7,
                label="rejected candidate (held-out)",
            )
        rolling = rolling_success(curve.get("traffic", []), window)
        if rolling:
            ax.plot(
                [m for m, _ in rolling],
                [100 * r for _, r in rolling],
                color="tab:green",
                alpha=0.6,
                linewidth=1,
                label=f"live traffic success, last {window} requests "
                f"(temperature {curve.get('settings', {}).get('temperature', 1.0):g})",
            )
        _plot_test(ax, curve)
        ax.set_xlabel("minutes")
        ax.set_ylabel("exact answers (%)")
        ax.set_ylim(-2, 102)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        served_by = " (served by vLLM)" if curve.get("settings", {}).get("runtime") == "vllm" else ""
        ax.set_title(f"Reef demo: SmolLM2-135M learning one-word answers while it serves{served_by}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def success_on_test(curve: dict[str, Any]) -> list[tuple[float, float]]:
    """(minute, success) of the test questions at the start and at the end, where measured."""
    test = curve.get("test") or {}
    return [
        (minute, test[key]["success"])
        for key, minute in (("start", 0.0), ("final", _final_test_minute(curve)))
        if (test.get(key) or {}).get("success") is not None
    ]


def _plot_test(ax: Any, curve: dict[str, Any]) -> None:
    """The test questions' success at the start and at the end, as two diamonds."""
    points = success_on_test(curve)
    if points:
        ax.plot(
            [m for m, _ in points],
            [100 * v for _, v in points],
            "D",
            color="tab:purple",
            markersize=7,
            label="test success, start and end (greedy; nothing trained or selected on it)",
        )


def _traffic_end(curve: dict[str, Any]) -> float:
    return float(curve.get("summary", {}).get("minutes") or 0)


def _final_test_minute(curve: dict[str, Any]) -> float:
    """When the final test was asked: after the traffic, and after the gate judged what it left
    (curves written before `final.minute` was kept: the traffic's end)."""
    final = (curve.get("test") or {}).get("final") or {}
    return float(final.get("minute") or _traffic_end(curve))


def write_curve(curve: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """`learning_curve.json` and `learning_curve.png` in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "learning_curve.json"
    json_path.write_text(json.dumps(curve, indent=2, sort_keys=True) + "\n")
    png_path = plot_learning_curve(curve, out_dir / "learning_curve.png")
    return png_path, json_path


def curve_table(curve: dict[str, Any]) -> Any:
    """The held-out curve and live traffic per release, as a rich Table."""
    from rich.table import Table

    table = Table(title="Learning curve (held-out success as the gate measured it)")
    for column in ("minute", "release", "held-out success", "held-out score", "live requests", "live success"):
        table.add_column(column, justify="right" if column != "release" else "left")
    live = {r["release_id"]: r for r in curve.get("releases", [])}
    for point in sorted(curve.get("heldout", []), key=lambda p: p["minute"]):
        row = live.get(point["release_id"] or "", {})
        table.add_row(
            f"{point['minute']:.1f}",
            f"{(point['release_id'] or '?')[:12]} ({point['kind']})",
            _pct(point.get("success")),
            _num(point.get("score")),
            str(row.get("requests", "-")),
            _pct(row.get("success_rate")),
        )
    if not curve.get("heldout"):
        table.add_row("-", "no gate verdict yet", "-", "-", "-", "-")
    test = curve.get("test") or {}
    if test:
        start, final = (test.get(k) or {} for k in ("start", "final"))
        table.caption = (
            f"test questions (never trained or selected on), greedy: {_pct(start.get('success'))} at the "
            f"start, {_pct(final.get('success'))} at the end ({(final.get('release_id') or '?')[:12]})"
        )
    return table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
