"""The canary: a fraction of an opted-in scenario's requests served by the candidate under test.

The newest weights candidate of the line the gate judges (the one it judges now or takes next)
is served by the server (`reef.serve.canary`) to `learner.canary.<scenario>` of that scenario's
new requests, until a newer candidate replaces it, the gate has judged it, or its line is
dropped: recorded, receipted and reportable like any other, marked by their release id
`canary-<batch id>`. Its reported records are the freshest samples the learner has (the policy
being trained continues from that candidate), and their live scores are compared with the
serving release's latest (SERVING_WINDOW, so a canary serving every request still has a
yardstick): a canary whose live scores are worse (one-sided two-sample z-test at WORSE_Z on the
pooled variance, at least MIN_SCORES of each; and from its WITHDRAW_BY-th score on, any mean
below the serving release's) is withdrawn at once, whatever the gate is still doing, so a worse
candidate serves at most WITHDRAW_BY reported requests (a client whose scores favour it, flipped
or lying, is bounded only by the fraction, at most `learner.canary_max_fraction`). The variance
is pooled because scores are skewed: a few scores of a canary as good as the serving release are
often all 0 (variance 0), and a test on each side's own variance would then withdraw it on the
serving side's spread alone. A scenario that does not opt in never gets one.

The split (`gate.live_split`): once the gate's tasks have left STALLED_VERDICTS candidates in a
row undecided against the same serving release, none of them behind on the tasks, the canaries
started from then on serve the split's fraction and the serving release the rest, until the head
moves; the scores of those canaries (the line) and of the serving release over the same time are
the live evidence the learner hands the gate with each later candidate (at least MIN_SPLIT_SCORES
of each). When the line is dropped, both start again (the new line is not the old one).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from reef.core.learned import LearnedCandidate
from reef.core.live_evidence import LiveEvidence, ScoreSummary, two_sample_z
from reef.core.types import ReportedRecords, Verdict
from reef.grow.learner_stats import behind_on_tasks
from reef.grow.loop import HasLastError

log = logging.getLogger("reef.learner")

CANARY_PREFIX = "canary-"
MIN_SCORES = 8  # of each side before live scores may withdraw a canary
WORSE_Z = 1.645  # one-sided 95%
# The bound on a worse canary's reports: once it has this many scores, a mean below the serving
# release's withdraws it whether or not the z-test is sure yet (a canary half a standard deviation
# worse reaches WORSE_Z by then only about three times in four; one that is not worse loses only its
# canary, never its verdict)
WITHDRAW_BY = 32
SERVING_WINDOW = 64  # the serving release's latest scores, the canary's yardstick (also at fraction 1)
KEEP_CANARIES = 16  # recent canaries whose scores are kept (one may be published after a newer one started)
MIN_SPLIT_SCORES = 32  # of each side before the split's live scores join a verdict
SPLIT_WINDOW = 2048  # the latest scores kept of each side; both are cut to the time both cover
# verdicts in a row that run to their last look undecided against one head, their candidates not
# behind on the tasks, before the split begins: it moves training samples to the serving release,
# so it waits for the tasks to stall
STALLED_VERDICTS = 3


class CanaryServing(Protocol):  # reef.serve.canary.ScenarioCanary
    fraction: float

    async def start(self, batch_id: str, files: Mapping[str, bytes]) -> str:
        """Serve `files` to the fraction; return the canary's release id, as it begins to admit
        requests and with nothing awaited after (the learner checks then that the head is still
        its line's, before any request can meet the canary)."""

    async def stop(self) -> None:
        """Admit no more requests to it; its load goes once the last of them ends."""


def canary_release_id(batch_id: str) -> str:
    return f"{CANARY_PREFIX}{batch_id}"


def live_worse(canary: Sequence[float], serving: Sequence[float]) -> bool:
    """Whether live scores say the canary is worse than the serving release: surely (the z-test),
    or, from its WITHDRAW_BY-th score on, its mean below the serving release's at all."""
    if len(canary) < MIN_SCORES or len(serving) < MIN_SCORES:
        return False
    if len(canary) >= WITHDRAW_BY and _mean(canary) < _mean(serving):
        return True
    return two_sample_z(ScoreSummary.of(serving), ScoreSummary.of(canary)) >= WORSE_Z


@dataclass
class LiveScores:
    """Reported scores of the serving release's latest requests and of the recent canaries'."""

    serving_id: str = ""
    serving: deque[float] = field(default_factory=lambda: deque(maxlen=SERVING_WINDOW))
    canary_id: str | None = None
    scores: dict[str, list[float]] = field(default_factory=dict)  # canary release id -> its scores (recent ones)
    running: bool = False
    withdrawn: int = 0
    split: bool = False  # the line and the serving release served side by side (gate.live_split)
    split_canaries: set[str] = field(default_factory=set)  # canaries started during the split
    line_split: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=SPLIT_WINDOW))  # (time, score)
    serving_split: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=SPLIT_WINDOW))

    @property
    def canary(self) -> list[float]:
        return self.scores.get(self.canary_id or "", [])

    def start(self, release_id: str) -> None:
        self.canary_id, self.running = release_id, True
        self.scores[release_id] = []
        if self.split:
            self.split_canaries.add(release_id)
        while len(self.scores) > KEEP_CANARIES:
            del self.scores[next(iter(self.scores))]

    def published(self, release_id: str, canary_id: str) -> None:
        """A candidate that was a canary is the serving release now: its live scores start the
        yardstick (at fraction 1 nothing else would)."""
        self.serving_id, self.serving = release_id, deque(self.scores.get(canary_id, []), maxlen=SERVING_WINDOW)
        self.end_split()

    def add(self, items: Sequence[ReportedRecords], serving_id: str) -> None:
        if serving_id != self.serving_id:  # a new serving release: its own scores from here on
            self.serving_id, self.serving = serving_id, deque(maxlen=SERVING_WINDOW)
            self.end_split()
        for item in items:
            for record in item.records:
                release = record.release.release_id if record.release is not None else None
                score, at = item.report.score, item.report.created_at or 0.0
                if release == serving_id:
                    self.serving.append(score)
                    if self.split:
                        self.serving_split.append((at, score))
                elif release in self.scores:
                    self.scores[release].append(score)
                    if release in self.split_canaries:
                        self.line_split.append((at, score))

    def begin_split(self) -> None:
        """Serve the line and the serving release side by side from the next canary on."""
        self.end_split()
        self.split = True

    def end_split(self) -> None:
        self.split = False
        self.split_canaries = set()
        self.line_split, self.serving_split = deque(maxlen=SPLIT_WINDOW), deque(maxlen=SPLIT_WINDOW)

    def evidence(self) -> LiveEvidence | None:
        """The split's live scores over the time both sides' kept scores cover, once there are
        enough of each side."""
        if not self.split:
            return None
        # a side that dropped nothing covers the split from its start; one that did, from its oldest kept
        since = max(
            [side[0][0] for side in (self.line_split, self.serving_split) if len(side) == side.maxlen], default=0.0
        )
        line = [score for at, score in self.line_split if at >= since]
        serving = [score for at, score in self.serving_split if at >= since]
        if min(len(line), len(serving)) < MIN_SPLIT_SCORES:
            return None
        return LiveEvidence(ScoreSummary.of(line), ScoreSummary.of(serving), self.serving_id)

    def worse(self) -> bool:
        return self.running and live_worse(self.canary, list(self.serving))

    def summary(self, **more: object) -> dict[str, object]:
        canary = self.canary
        return {
            **more,
            "withdrawn": self.withdrawn,
            "release_id": self.canary_id,
            "running": self.running,
            "scores": len(canary),
            "mean": _mean(canary) if canary else None,
            "serving_release_id": self.serving_id,
            "serving_scores": len(self.serving),
            "serving_mean": _mean(self.serving) if self.serving else None,
            "split": self.split,
            "split_scores": [len(self.line_split), len(self.serving_split)],
        }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class CanaryLoop:
    """The canary's own lane: it takes candidates from training (`serve`), the reported records
    the learner reads (`watch`, which withdraws a worse canary at once) and the gate's outcomes
    (`left_gate`, `published`); a moved head stops it (`stop`). `serving` None: no canary."""

    def __init__(
        self, scenario: str, serving: CanaryServing | None, live_split: float | None, stats: HasLastError
    ) -> None:
        self.scenario = scenario
        self.serving = serving
        self.fraction = serving.fraction if serving is not None else 0.0  # learner.canary's
        self.live_split = live_split if serving is not None else None  # gate.live_split
        self.stats = stats
        self.live = LiveScores()  # the canary's live scores and the serving release's
        self.batch: str | None = None  # the candidate the canary serves
        # that candidate's metrics, which its commit-log line (published, rejected or abandoned)
        # is written from: a withdrawal is noted there, so it outlives the process
        self.batch_metrics: dict[str, Any] = {}
        self.stalled = ("", 0)  # (head, verdicts in a row left undecided against it), for the split

    async def serve(self, candidate: LearnedCandidate, line_live: Callable[[], bool]) -> None:
        """Serve the newest candidate of the line the gate judges (in place of an older one): the
        next trains on from it, so its samples are nearly on-policy. Never one of a line the head
        has left (`line_live` false: a rollback or promote since the line began)."""
        if self.serving is None:
            return
        if not line_live():
            await self.stop()  # the one before is of that line too
            return
        self.serving.fraction = self.live_split if self.live.split and self.live_split else self.fraction
        try:
            release_id = await self.serving.start(candidate.batch_id, candidate.files)
        except Exception as exc:  # noqa: BLE001 - no canary for this one; the gate judges it all the same
            log.exception("learner %s: the canary of batch %s did not start", self.scenario, candidate.batch_id)
            self.stats.last_error = f"canary: {type(exc).__name__}: {exc}"
            self.live.running, self.batch = False, None  # the one before was stopped first
            return
        self.batch, self.batch_metrics = candidate.batch_id, candidate.metrics
        self.live.start(release_id)
        # `start` returned as the canary began to admit requests, nothing awaited since: a rollback
        # that moved the head while it loaded is seen here before any request meets the canary (one
        # that moves it later stops it itself, `head_moved`)
        if not line_live():
            log.warning(
                "learner %s: the canary of batch %s stopped as it started: the head moved under its line",
                self.scenario,
                candidate.batch_id,
            )
            await self.stop()

    async def stop(self) -> None:
        if self.serving is not None and self.live.running:
            self.live.running, self.batch = False, None
            await self.serving.stop()

    async def watch(self, items: list[ReportedRecords], serving_id: str) -> None:
        """Withdraw the canary at once when its live scores are worse than the serving release's."""
        if self.serving is None:
            return
        self.live.add(items, serving_id)
        if self.live.worse():
            self.live.withdrawn += 1
            self.batch_metrics["canary"] = {**self.live.summary(fraction=self.fraction), "withdrawn": True}
            log.warning(
                "learner %s: canary withdrawn, its live scores are worse: %s", self.scenario, self.live.summary()
            )
            await self.stop()

    async def left_gate(self, batch_id: str, line_dropped: bool) -> None:
        """Judged (served now as the head, or rejected), or its line dropped: the canary stops."""
        if self.batch == batch_id or line_dropped:
            await self.stop()

    def published(self, head: str, batch_id: str) -> None:
        if self.serving is not None:
            self.live.published(head, canary_release_id(batch_id))

    def undecided(self, verdict: Verdict, head: str) -> None:
        """A rejected candidate of the line the learner trains on: once STALLED_VERDICTS in a row
        against `head` ran to their last look undecided, none behind on the tasks (verdicts of
        other kinds in between are not counted), the tasks alone cannot tell: the split begins."""
        if not self.live_split or self.live.split or verdict.metrics.get("early") is not False:
            return
        if behind_on_tasks(verdict):
            return
        count = self.stalled[1] + 1 if self.stalled[0] == head else 1
        self.stalled = (head, count)
        if count >= STALLED_VERDICTS:
            self.live.begin_split()  # serve the line beside the head
            log.info(
                "learner %s: the line and the serving release now share the traffic (%s to the line)",
                self.scenario,
                self.live_split,
            )

    def line_dropped(self) -> None:
        if self.live.split:  # the new line's live scores are its own
            self.live.begin_split()

    def summary(self) -> dict[str, object] | None:
        return None if self.serving is None else self.live.summary(fraction=self.serving.fraction)
