"""A tour of Reef's durable state, with no server: record an exchange, report on it, publish
a trained release, roll back, and read it all back. Run it, then `reef inspect`:

    .venv/bin/python examples/state_tour.py /tmp/reef-tour
    .venv/bin/reef inspect --state-dir /tmp/reef-tour
"""

from __future__ import annotations

import sys

from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.canonical import new_id
from reef.core.types import ArtifactKind, Record, RecordStatus, Report, Verdict


def main(root: str) -> None:
    with ReefState.open(root) as state:
        chain = state.create("tour", recipe="skills")
        head = chain.head()
        receipt = new_id()
        state.store.put_record(
            Record(
                id=receipt,
                scenario="tour",
                release=chain.serving(),
                status=RecordStatus.COMPLETE,
                request={"messages": [{"role": "user", "content": "Say hi"}]},
                response={"content": "hello"},
                session="demo-session",
            )
        )
        state.store.put_report(
            Report(id=new_id(), scenario="tour", references=(receipt,), score=0.0, feedback="greet with 'hi', as asked")
        )
        for item in state.store.reported_since("tour", cursor=chain.high_water()):
            print(f"report {item.report.id[:8]} score {item.report.score} on {len(item.records)} record(s)")
        better = Candidate({"rules/greeting.md": b"Use the user's exact greeting word.\n"}, ArtifactKind.HARNESS)
        published = chain.publish(better, head.release_id, verdict=Verdict("select", {"wins": 3, "losses": 0}))
        print(f"published step {published.step}: {published.release_id[:12]} content {published.content_id[:19]}")
        print(state.artifacts.diff(head.release_id, published.release_id))
        back = chain.rollback(head.release_id, expected_head=published.release_id)
        print(
            f"rolled back at step {back.step}: new release {back.release_id[:12]}, same content as step 1: "
            f"{back.content_id == head.content_id}"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".reef")
