"""Durable writes per second in the experience store, on this machine.

For 1 and 8 concurrent writers: records created per second and reports ingested per second,
each call durable (fsynced) before it returns. The baseline, measured in the same run, is the
same store without group commit (`max_batch=1`: one transaction, one fsync per write); the
ratio shows what group commit buys. Run on its own (not in CI):

    .venv/bin/python bench/store.py [--seconds 3] [--out bench/results/store.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

from reef.core.types import Record, RecordStatus, ReleaseRef, Report
from reef.observe.sqlite_store import SQLiteStore

RELEASE = ReleaseRef("f" * 40, "sha256:" + "e" * 64)
REQUEST = {"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France? " * 4}]}
RESPONSE = {"choices": [{"message": {"role": "assistant", "content": "Paris." * 10}}]}


def record(writer: int, i: int) -> Record:
    return Record(
        id=f"w{writer}-{i}",
        scenario="bench",
        release=RELEASE,
        request=REQUEST,
        status=RecordStatus.COMPLETE,
        response=RESPONSE,
        token_ids=list(range(64)),
        logprobs=[-0.5] * 64,
        tags={"bench": "1"},
    )


def run_writers(writers: int, seconds: float, write) -> tuple[float, list[int]]:  # type: ignore[no-untyped-def]
    """Run `write(writer, i)` in `writers` threads for `seconds`; the rate and each one's count."""
    counts = [0] * writers
    stop = time.monotonic() + seconds

    def loop(w: int) -> None:
        i = 0
        while time.monotonic() < stop:
            write(w, i)
            i += 1
        counts[w] = i

    threads = [threading.Thread(target=loop, args=(w,)) for w in range(writers)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start), counts


def measure(max_batch: int, writers: int, seconds: float) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="reef-bench-"))
    try:
        store = SQLiteStore(root / "experience.db", max_batch=max_batch)
        records_per_s, written = run_writers(writers, seconds, lambda w, i: store.put_record(record(w, i)))

        def report(w: int, i: int) -> None:
            store.put_report(
                Report(
                    id=f"rep-w{w}-{i}",
                    scenario="bench",
                    references=(f"w{w}-{i % max(written[w], 1)}",),
                    score=1.0,
                    feedback="ok",
                )
            )

        reports_per_s, _ = run_writers(writers, seconds, report)
        store.close()
        return {"records_per_s": round(records_per_s, 1), "reports_per_s": round(reports_per_s, 1)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement")
    parser.add_argument("--out", type=Path, default=Path("bench/results/store.json"))
    args = parser.parse_args()
    results = []
    print(f"{'writers':>7} {'mode':>14} {'records/s':>10} {'reports/s':>10} {'x baseline':>11}")
    for writers in (1, 8, 32):
        baseline = measure(1, writers, args.seconds)
        grouped = measure(256, writers, args.seconds)
        ratio = grouped["records_per_s"] / baseline["records_per_s"]
        for mode, figures, r in (("fsync each", baseline, 1.0), ("group commit", grouped, ratio)):
            print(
                f"{writers:>7} {mode:>14} {figures['records_per_s']:>10.0f} {figures['reports_per_s']:>10.0f} {r:>10.2f}x"
            )
            results.append({"writers": writers, "mode": mode, **figures, "ratio_to_baseline": round(r, 2)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "store", "seconds": args.seconds, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
