"""The state directory: the experience store, the artifact store and every scenario's chain.

    <state>/experience.db         records and reports (SQLite; or a PostgreSQL store given in)
    <state>/artifacts.git/        bare git repository, one ref per scenario, LFS objects inside
    <state>/commits/<key>.jsonl   one commit log per scenario (key: urlsafe base64 of the name)

The commit logs follow the store: with a PostgreSQL experience store they live in the same
database and schema (`reef/commit/pg_commit_log.py`), shared by every front end, and the JSONL
files are not used (a scenario the database does not know yet is imported from them once, when
the state directory is opened). Artifacts stay in the state directory either way, so with a
shared log every front end must be able to read every release's objects; one that cannot
fails with `MissingArtifact` naming the release and the missing object.

Opening it is recovery: every log is read (a torn last line truncated, other damage an error
naming file and line), each scenario's head must have its artifact (else `MissingArtifact`
naming it), each scenario's git ref is repaired from its log, and logged compactions are
applied again (a crash may have come between the log line and the delete).

Older releases are checked when their content is read (`ArtifactStore.files` refuses a missing
or corrupted artifact, naming the release), not at open: checking them all made every restart
as slow as the chain was long. `verify_artifacts` checks them all (`reef inspect` runs it).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from reef.commit.artifacts import ArtifactManifest, ArtifactStore
from reef.commit.commit_log import CommitLogs, JsonlCommitLogs
from reef.commit.release_chain import Candidate, ReleaseChain, last_artifact_release
from reef.core.canonical import check_scenario_name
from reef.core.errors import Conflict, MissingArtifact, NotFound
from reef.core.types import ArtifactKind, CommitEntry, Operation, ReleaseRef
from reef.observe.sqlite_store import SQLiteStore
from reef.observe.store import ExperienceStore

EMPTY = Candidate({}, ArtifactKind.EMPTY, {"kind": "empty"})


class ReefState:
    def __init__(
        self, root: Path | str, store: ExperienceStore | None = None, commit_logs: CommitLogs | None = None
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.commits_dir = self.root / "commits"
        self.store = store if store is not None else SQLiteStore(self.root / "experience.db")
        self._lock = threading.Lock()
        self._chains: dict[str, ReleaseChain] = {}
        try:
            self.commit_logs = commit_logs if commit_logs is not None else commit_logs_for(self.store, self.commits_dir)
            self.artifacts = ArtifactStore(self.root / "artifacts.git")
            self._recover()
        except BaseException:
            self._close_logs()
            if store is None:
                self.store.close()  # ours; a store handed in stays the caller's
            raise

    @classmethod
    def open(
        cls, root: Path | str, store: ExperienceStore | None = None, commit_logs: CommitLogs | None = None
    ) -> ReefState:
        """Open the state directory. The commit logs follow the store (`commit_logs_for`)
        unless given."""
        return cls(root, store, commit_logs)

    def close(self) -> None:
        self._close_logs()
        self.store.close()

    def _close_logs(self) -> None:
        with self._lock:
            for chain in self._chains.values():
                chain.log.close()
            self._chains.clear()
        logs = getattr(self, "commit_logs", None)
        if logs is not None:
            logs.close()

    def __enter__(self) -> ReefState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scenarios -----------------------------------------------------------------------

    def scenarios(self) -> list[str]:
        with self._lock:
            return sorted(self._chains)

    def chain(self, scenario: str) -> ReleaseChain:
        with self._lock:
            chain = self._chains.get(scenario)
        if chain is None:
            raise NotFound(f"unknown scenario {scenario!r}")
        return chain

    def head(self, scenario: str) -> ReleaseRef:
        return self.chain(scenario).head().ref

    def verify_artifacts(self) -> None:
        """Every release of every scenario has its commit, manifest and LFS objects, else
        `MissingArtifact` naming the first that does not."""
        for name in self.scenarios():
            for release in self.chain(name).releases():
                self.artifacts.verify(release.release_id)

    def create(
        self,
        scenario: str,
        recipe: str,
        starting_release: str | None = None,
        seed: Candidate | None = None,
    ) -> ReleaseChain:
        """Create a scenario bound for life to `recipe` and its starting release; creating it
        again with the same binding returns it, with another binding is a `Conflict`."""
        check_scenario_name(scenario)
        binding = {"recipe": recipe, "starting_release_id": starting_release}
        with self._lock:
            chain = self._chains.get(scenario) or self._open_chain(scenario)
            with chain.log.transaction():
                entries = chain.log.entries()
                if not entries:
                    self._write_creation(chain, binding, seed)
            _check_binding(scenario, chain.binding, binding)
            self._chains[scenario] = chain
            return chain

    def _open_chain(self, scenario: str) -> ReleaseChain:
        return ReleaseChain(scenario, self.commit_logs.open(scenario), self.artifacts)

    def _write_creation(self, chain: ReleaseChain, binding: dict, seed: Candidate | None) -> None:
        start = binding["starting_release_id"]
        if start is not None:
            if not self.artifacts.has_release(start):
                raise NotFound(f"unknown starting release {start}")
            manifest = self.artifacts.manifest(start)
            candidate = Candidate(self.artifacts.files(start), ArtifactKind(manifest.kind),
                                  {"kind": "fork", "release_id": start}, manifest.metadata)
        else:
            candidate = seed or EMPTY
        if self.artifacts.scenario_head(chain.scenario) is not None:
            self.artifacts.reset_scenario_head(chain.scenario, None)  # leftover of a crashed creation
        manifest = ArtifactManifest(candidate.content_id, start, candidate.kind.value, dict(candidate.source),
                                    dict(candidate.metadata))
        release_id = self.artifacts.commit(chain.scenario, candidate.files, manifest, expected_parent=None)
        entry = CommitEntry(
            scenario=chain.scenario,
            step=1,
            operation=Operation.CREATION,
            release=ReleaseRef(release_id, candidate.content_id),
            parent_release_id=start,
            checkpoint=True,
            binding=binding,
        )
        chain.log.append(entry, expected_step=0)

    # -- recovery ------------------------------------------------------------------------

    def _recover(self) -> None:
        self._adopt_local_logs()
        logs = self.commit_logs.recover()
        try:
            for log in list(logs):
                entries = log.entries()
                scenario = entries[0].scenario
                chain = ReleaseChain(scenario, log, self.artifacts)
                self._chains[scenario] = chain
                logs.remove(log)
                logged = last_artifact_release(entries)
                for release_id in {chain.head().release_id, logged}:  # served, and mirrored by the git ref
                    self._verify(scenario, release_id)
                if self.artifacts.scenario_head(scenario) != logged:
                    self.artifacts.reset_scenario_head(scenario, logged)
                compacted = [rid for entry in entries for rid in entry.compacted_ids]
                if compacted:
                    self.store.compact(scenario, compacted)
        finally:
            for log in logs:
                log.close()

    def _verify(self, scenario: str, release_id: str) -> None:
        try:
            self.artifacts.verify(release_id)
        except MissingArtifact as exc:
            if isinstance(self.commit_logs, JsonlCommitLogs):
                raise
            raise MissingArtifact(
                f"scenario {scenario!r}: {exc} (the commit log in {self.commit_logs.where} names it, but this front "
                f"end's artifact store {self.artifacts.root} lacks it: every front end on a shared commit log must "
                "be able to read every release's artifacts)"
            ) from exc

    def _adopt_local_logs(self) -> None:
        """With a log backend other than the state directory's files, a scenario it does not
        know yet but a JSONL log here does (a state directory from before the shared log) is
        imported, all its steps at once; the files are left as they are and unused."""
        if isinstance(self.commit_logs, JsonlCommitLogs) or not any(self.commits_dir.glob("*.jsonl")):
            return
        for log in JsonlCommitLogs(self.commits_dir).recover():
            try:
                assert log.scenario is not None
                self.commit_logs.adopt(log.scenario, log.entries())
            finally:
                log.close()


def commit_logs_for(store: ExperienceStore, commits_dir: Path) -> CommitLogs:
    """The commit-log backend that goes with `store`: the same PostgreSQL database and schema
    for a `PostgresStore` (every front end on it shares the logs), else one JSONL file per
    scenario in `commits_dir`."""
    pg = sys.modules.get("reef.observe.postgres_store")  # loaded if `store` is one; never imported here
    if pg is not None and isinstance(store, pg.PostgresStore):
        from reef.commit.pg_commit_log import PgCommitLogs

        return PgCommitLogs(store.dsn, schema=store.schema)
    return JsonlCommitLogs(commits_dir)


def _check_binding(scenario: str, bound: dict, asked: dict) -> None:
    for key in ("recipe", "starting_release_id"):
        if bound.get(key) != asked.get(key):
            raise Conflict(
                f"scenario {scenario!r} is bound to {key} {bound.get(key)!r}; {asked.get(key)!r} contradicts it"
            )
