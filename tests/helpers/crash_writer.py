"""A child process for the crash tests: writes records, reports and releases into a state
directory forever, printing one line per acknowledged write, until it is killed."""

from __future__ import annotations

import sys

from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.errors import StaleHead
from reef.core.types import ArtifactKind, Record, RecordStatus, Report, Verdict


def main(root: str, run: str) -> None:
    state = ReefState.open(root)
    chain = state.create("crash", "sao")
    print("READY", flush=True)
    i = 0
    while True:
        i += 1
        rid = f"{run}-{i}"
        state.store.put_record(
            Record(
                id=rid,
                scenario="crash",
                release=chain.head().ref,
                request={"i": i},
                status=RecordStatus.COMPLETE,
                response={"text": "x" * (i % 50)},
            )
        )
        print(f"R {rid}", flush=True)
        state.store.put_report(Report(id=f"rep-{rid}", scenario="crash", references=(rid,), score=i % 3))
        print(f"P rep-{rid}", flush=True)
        if i % 5 == 0:
            files = {"adapter_model.safetensors": f"{run}-{i}".encode() * 100, "notes.md": b"step"}
            try:
                release = chain.publish(
                    Candidate(files, ArtifactKind.WEIGHTS),
                    chain.head().release_id,
                    verdict=Verdict("select"),
                    high_water=i,
                )
            except StaleHead:
                continue
            print(f"S {release.step} {release.release_id}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
