"""How old were the samples a race's learner trained on? After a race run with `--line` and
`--workdir`:

    .venv/bin/python bench/sample_lag.py WORKDIR [WORKDIR ...] [--every 2] [--fresh-wait N] [--cycle]

For each batch the learner logged, in the order it logged them, every record it trains on is
named by what served it: a canary (`canary-<batch id>`, a candidate of the line) or a release.
Batches are counted in log order, across a dropped line's restart (rare: a line dropped by the
gate). A batch is the line's n-th candidate and trains on from the (n-1)-th; a record served by the
canary of the (n-k)-th candidate is "k candidates back" (k = 2: the weights one candidate, the
demo's two optimiser steps, before the ones it trains on from, so its two steps take samples two
and three steps old). Prints, for each stretch of `--every` minutes of the run, the share of the
trained records at each lag, those served by a release (the head: off the line altogether, as
with `gate.live_split`), and by a canary of a batch not in the log (gone). No model, seconds.

With `--fresh-wait N`: how much longer each batch would have waited for N samples of its own
line's newest candidate (the canary of the batch before it, the one it trains on from): the
seconds from when the batch was logged until the N-th record that canary served was reported (0
where they were there already), beside the seconds between batches. What bench/race_line.py's
`fresh` costs a candidate, read off a run that did not wait.

With `--cycle`: per candidate of the line, the seconds from its batch's log entry to its adapter
in the workdir's `line/` (bench/race_line.py writes each one there, named by the second it was
made: training it, the gate's jobs in the trainer included) and from then to the next batch's
entry (the learner waiting for samples, or for its turn in the trainer), medians and quartiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reef.commit.commit_log import JsonlCommitLogs  # noqa: E402
from reef.core.types import CommitEntry, Operation  # noqa: E402
from reef.grow.canary import CANARY_PREFIX  # noqa: E402
from reef.observe.sqlite_store import SQLiteStore  # noqa: E402

MOST_LAG = 3  # lags above this are counted together


def commit_entries(state_dir: Path) -> list[CommitEntry]:
    """Every entry of a state directory's commit logs, scenario by scenario, each in log order."""
    if not (state_dir / "commits").is_dir():
        raise SystemExit(f"{state_dir / 'commits'}: no commit logs there (give a race's --workdir)")
    logs = JsonlCommitLogs(state_dir / "commits").recover()
    try:
        return [entry for log in logs for entry in log.entries()]
    finally:
        for log in logs:
            log.close()


def batches(state_dir: Path) -> list[tuple[float, str, list[str]]]:
    """(recorded at, batch id, record ids) of every batch the learner logged, in log order."""
    return [(entry.recorded_at, entry.batch["batch_id"], list(entry.batch["record_ids"]))
            for entry in commit_entries(state_dir) if entry.operation == Operation.BATCH and entry.batch]


def source(release_id: str | None, position: int, positions: dict[str, int]) -> str:
    """What served a record, as seen from the batch at `position`."""
    if release_id is None or not release_id.startswith(CANARY_PREFIX):
        return "release"
    served_by = positions.get(release_id[len(CANARY_PREFIX):])
    if served_by is None:
        return "gone"
    lag = position - served_by
    return f"{lag}" if lag <= MOST_LAG else f"{MOST_LAG + 1}+"


def lags(workdir: Path, every_minutes: float) -> dict[int, Counter[str]]:
    """{stretch of the run: Counter(source)} over every record a batch trained on."""
    logged = batches(workdir / "state")
    positions = {batch_id: n for n, (_, batch_id, _) in enumerate(logged)}
    store = SQLiteStore(workdir / "state" / "experience.db")
    out: dict[int, Counter[str]] = {}
    try:
        start = logged[0][0] if logged else 0.0
        for at, batch_id, record_ids in logged:
            stretch = out.setdefault(int((at - start) / 60 / every_minutes), Counter())
            for record_id in record_ids:
                release = store.get_record(record_id).release
                stretch[source(release.release_id if release else None, positions[batch_id], positions)] += 1
    finally:
        store.close()
    return out


def fresh_waits(workdir: Path, count: int) -> tuple[list[float], list[float]]:
    """(for each batch after the first whose previous batch's canary served `count` reported
    records: how much longer it would have waited for them; the seconds between batches)."""
    logged = batches(workdir / "state")
    reported: dict[str, list[float]] = {}  # canary release id -> when its records were reported
    store = SQLiteStore(workdir / "state" / "experience.db")
    try:
        for scenario in {entry.scenario for entry in commit_entries(workdir / "state")}:
            cursor = 0
            while items := store.reported_since(scenario, cursor, limit=1000):
                for item in items:
                    for record in item.records:
                        if record.release is not None and record.release.release_id.startswith(CANARY_PREFIX):
                            reported.setdefault(record.release.release_id, []).append(item.report.created_at or 0.0)
                cursor = items[-1].cursor
    finally:
        store.close()
    waits = []
    for (_, previous, _), (at, _, _) in zip(logged, logged[1:]):
        times = sorted(reported.get(f"{CANARY_PREFIX}{previous}", []))
        if len(times) >= count:
            waits.append(max(0.0, times[count - 1] - at))
    return waits, [at - before for (before, _, _), (at, _, _) in zip(logged, logged[1:])]


def fresh_wait_text(workdir: Path, count: int) -> str:
    waits, gaps = fresh_waits(workdir, count)
    if not waits:
        return f"{workdir}: no batch's previous canary served {count} reported records"
    return (f"{workdir}: waiting for {count} samples of the newest candidate, {len(waits)} of {len(gaps)} batches "
            f"would have waited {spread(waits, ' more')}; "
            f"the batches came {statistics.median(gaps):.1f} s apart")


def cycles(workdir: Path) -> list[tuple[float, float]]:
    """(seconds training, seconds until the next batch) for each logged batch but the last whose
    candidate is in `line/`: the first adapter made after the batch was logged and before the next."""
    made = sorted(float(path.stem) for path in (workdir / "line").glob("*.safetensors"))
    logged = [at for at, _, _ in batches(workdir / "state")]
    out = []
    for at, following in zip(logged, logged[1:]):
        candidate = next((t for t in made if at <= t <= following), None)
        if candidate is not None:
            out.append((candidate - at, following - candidate))
    return out


def spread(values: list[float], after: str = "") -> str:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{statistics.median(values):.1f} s{after} (quartiles {quartiles[0]:.1f}-{quartiles[2]:.1f})"


def cycle_text(workdir: Path) -> str:
    if not (workdir / "line").is_dir():
        return f"{workdir}: no line/ there (a race run with --line writes each candidate to it)"
    found = cycles(workdir)
    if not found:
        return f"{workdir}: no candidate in line/ between two logged batches"
    return (f"{workdir}: {len(found)} candidates: training {spread([t for t, _ in found])}, "
            f"then until the next batch {spread([w for _, w in found])}")


def text(workdir: Path, by_stretch: dict[int, Counter[str]], every_minutes: float) -> list[str]:
    order = [f"{k}" for k in range(MOST_LAG + 1)] + [f"{MOST_LAG + 1}+", "gone", "release"]
    lines = [f"{workdir}: candidates back, share of the records trained on"]
    for stretch, counts in sorted(by_stretch.items()):
        total = sum(counts.values())
        shares = "  ".join(f"{name}: {100 * counts[name] / total:3.0f}%" for name in order if counts[name])
        lines.append(f"  minutes {stretch * every_minutes:4.1f}-{(stretch + 1) * every_minutes:4.1f} "
                     f"({total} records)  {shares}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdirs", nargs="+", type=Path)
    parser.add_argument("--every", type=float, default=2.0, help="minutes a line of the table covers")
    parser.add_argument("--fresh-wait", type=int, default=0, metavar="N",
                        help="also: how much longer each batch would have waited for N samples of the newest candidate")
    parser.add_argument("--cycle", action="store_true",
                        help="also: per candidate, the seconds training it and then until the next batch (needs line/)")
    args = parser.parse_args()
    for workdir in args.workdirs:
        print("\n".join(text(workdir, lags(workdir, args.every), args.every)))
        if args.fresh_wait:
            print(fresh_wait_text(workdir, args.fresh_wait))
        if args.cycle:
            print(cycle_text(workdir))


if __name__ == "__main__":
    main()
