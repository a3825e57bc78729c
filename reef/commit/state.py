"""The state directory: the experience store, the artifact store and every scenario's chain.

    <state>/experience.db         records and reports (SQLite; or a PostgreSQL store given in)
    <state>/artifacts.git/        bare git repository, one ref per scenario, LFS objects inside
    <state>/commits/<key>.jsonl   one commit log per scenario (key: urlsafe base64 of the name)

The commit logs follow the store: with a PostgreSQL experience store they live in the same
database and schema (`reef/commit/pg_commit_log.py`), shared by every front end, and the JSONL
files are not used (a scenario the database does not know yet is imported from them once, when
the state directory is opened). Artifacts live in the state directory either way; with an
artifact remote (`artifacts_remote`, the `artifacts.remote` setting) every release is pushed to
it before its step is logged and fetched from it by any front end that lacks it, so every front
end can read every release the shared log names. One that cannot (no remote, or the remote
lacks it too) fails with `MissingArtifact` naming the release and the missing object.

Opening it is recovery: every log is read (a torn last line truncated, other damage an error
naming file and line), each scenario's head must have its artifact (else `MissingArtifact`
naming it), a lock a killed git left on a scenario's ref is removed (under the scenario's log,
`reef/commit/git_locks.py`; `artifacts.cleared_locks` lists them), each scenario's git ref is
repaired from its log, and logged compactions are applied again (a crash may have come between
the log line and the delete).

Several processes may open one state directory at once and serve it together (`shared`,
`reef serve --workers N`): each repair happens while holding what the writers hold (a log's
torn line is cut under the file's `flock`, a scenario's ref is reset under its log's
transaction), so a process opening it never undoes a live writer's work in progress; the
SQLite store is shared by its own locking (WAL, a busy timeout); git objects any process wrote
are read by every other (one repository), and each scenario's git writes happen under its log.

Older releases are checked when their content is read (`ArtifactStore.files` refuses a missing
or corrupted artifact, naming the release), not at open: checking them all made every restart
as slow as the chain was long. `verify_artifacts` checks them all (`reef inspect` runs it).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from reef.commit.artifacts import ArtifactManifest, ArtifactStore, require_git
from reef.commit.commit_log import CommitLogs, JsonlCommitLogs
from reef.commit.release_chain import Candidate, ReleaseChain, last_artifact_release
from reef.core.canonical import check_scenario_name
from reef.core.errors import Conflict, InvalidInput, MissingArtifact, NotFound
from reef.core.types import ArtifactKind, CommitEntry, Operation, ReleaseRef
from reef.observe.sqlite_store import SQLiteStore
from reef.observe.store import ExperienceStore

EMPTY = Candidate({}, ArtifactKind.EMPTY, {"kind": "empty"})


class ReefState:
    def __init__(
        self,
        root: Path | str,
        store: ExperienceStore | None = None,
        commit_logs: CommitLogs | None = None,
        artifacts_remote: str | None = None,
        *,
        shared: bool = False,
    ) -> None:
        require_git()  # before anything is created: a state directory is no use without it
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.commits_dir = self.root / "commits"
        self.store = store if store is not None else SQLiteStore(self.root / "experience.db")
        self._lock = threading.Lock()
        self._chains: dict[str, ReleaseChain] = {}
        try:
            self.commit_logs = (
                commit_logs if commit_logs is not None else commit_logs_for(self.store, self.commits_dir, shared=shared)
            )
            self.artifacts = ArtifactStore(self.root / "artifacts.git", remote=artifacts_remote)
            self._recover()
        except BaseException:
            self._close_logs()
            if store is None:
                self.store.close()  # ours; a store handed in stays the caller's
            raise

    @classmethod
    def open(
        cls,
        root: Path | str,
        store: ExperienceStore | None = None,
        commit_logs: CommitLogs | None = None,
        artifacts_remote: str | None = None,
        *,
        shared: bool = False,
    ) -> ReefState:
        """Open the state directory. The commit logs follow the store (`commit_logs_for`)
        unless given; `artifacts_remote` (a git URL or a bare repository's path) shares the
        artifacts with every front end that names it; `shared`: other processes serve this
        state directory too, so its JSONL logs are followed (PostgreSQL logs always are)."""
        return cls(root, store, commit_logs, artifacts_remote, shared=shared)

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

    def scenario_count(self) -> int:
        """How many scenarios the state holds: on a shared log, those other processes or front
        ends created and this one has not followed yet too."""
        known = len(self.scenarios())
        if getattr(self.commit_logs, "shared", False):
            return max(known, len(self.commit_logs.heads()))  # type: ignore[attr-defined]
        return known

    def chain(self, scenario: str) -> ReleaseChain:
        """The scenario's chain. On a shared log, one that another process or front end created
        and this one has not followed yet is found in the log (a rollback sent to one worker
        right after the creation on another is not a 404)."""
        with self._lock:
            chain = self._chains.get(scenario)
        if chain is None and getattr(self.commit_logs, "shared", False) and _is_scenario_name(scenario):
            chain = self.discover(scenario)
        if chain is None:
            raise NotFound(f"unknown scenario {scenario!r}")
        return chain

    def discover(self, scenario: str) -> ReleaseChain | None:
        """A scenario another front end created on the shared commit log: its chain, now known
        here too (None while its log has no step). The log is read outside this state's lock: it
        may wait for another process's hold on the log, and lookups of other scenarios must not."""
        check_scenario_name(scenario)
        with self._lock:
            chain = self._chains.get(scenario)
        if chain is not None:
            return chain
        if isinstance(self.commit_logs, JsonlCommitLogs) and not self.commit_logs.exists(scenario):
            return None  # no file for a name nobody created (opening would make one)
        log = self.commit_logs.open(scenario)
        if not log.entries():
            log.close()
            return None
        with self._lock:
            chain = self._chains.get(scenario)
            if chain is None:
                chain = self._chains[scenario] = ReleaseChain(scenario, log, self.artifacts)
                return chain
        log.close()  # found meanwhile (created here, or discovered by another thread)
        return chain

    def forget(self, scenario: str) -> None:
        """Drop a scenario this state knows (archived: `reef/commit/archive.py`) and close its
        log; its name is free for a new scenario."""
        with self._lock:
            chain = self._chains.pop(scenario, None)
        if chain is not None:
            chain.log.close()

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
            candidate = Candidate(
                self.artifacts.files(start),
                ArtifactKind(manifest.kind),
                {"kind": "fork", "release_id": start},
                manifest.metadata,
            )
        else:
            candidate = seed or EMPTY
        if self.artifacts.scenario_head(chain.scenario) is not None:
            self.artifacts.reset_scenario_head(chain.scenario, None)  # leftover of a crashed creation
        manifest = ArtifactManifest(
            candidate.content_id, start, candidate.kind.value, dict(candidate.source), dict(candidate.metadata)
        )
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
            self.artifacts.clear_fetch_locks()
            if self.artifacts.remote is not None:
                self.artifacts.fetch()
            for log in list(logs):
                entries = log.entries()
                scenario = entries[0].scenario
                chain = ReleaseChain(scenario, log, self.artifacts)
                self._chains[scenario] = chain
                logs.remove(log)
                logged = last_artifact_release(entries)
                for release_id in {chain.head().release_id, logged}:  # served, and mirrored by the git ref
                    self._verify(scenario, release_id)
                self._clear_stale_lock(chain)
                self._repair_ref(chain, logged)
                if self.artifacts.remote is not None and logged and not self.artifacts.remote_has(scenario, logged):
                    self._publish_to_remote(chain)
                compacted = [rid for entry in entries for rid in entry.compacted_ids]
                if compacted:
                    self.store.compact(scenario, compacted)
        finally:
            for log in logs:
                log.close()

    def _clear_stale_lock(self, chain: ReleaseChain) -> None:
        """A lock a killed git left on the scenario's ref would fail every later move of it (every
        publish and rollback, for ever): removed while holding the log, which every writer of the
        ref in every process holds, so no live one is writing it."""
        if self.artifacts.scenario_lock(chain.scenario).exists():
            with chain.log.transaction():
                self.artifacts.clear_scenario_lock(chain.scenario)

    def _repair_ref(self, chain: ReleaseChain, logged: str | None) -> None:
        """Reset the scenario's git ref to the last release its log names (a crash between the
        git commit and the log line leaves it ahead). Only while holding the log: another
        process on this state directory may be between its commit and its append right now,
        and its ref is ahead for that moment, not for ever; once the log is held, nobody is."""
        if self.artifacts.scenario_head(chain.scenario) == logged:
            return
        with chain.log.transaction():
            logged = last_artifact_release(chain.log.entries())
            if self.artifacts.scenario_head(chain.scenario) != logged:
                self.artifacts.reset_scenario_head(chain.scenario, logged)

    def _publish_to_remote(self, chain: ReleaseChain) -> None:
        """Releases the log names that the remote lacks (a state directory from before the
        remote, or imported from JSONL): pushed, with every logged release's LFS objects, while
        the log is held, so no publisher is between its push and its log step meanwhile."""
        with chain.log.transaction():
            entries = chain.log.entries()
            logged = last_artifact_release(entries)
            if logged is None or self.artifacts.remote_has(chain.scenario, logged):
                return
            older = tuple(sorted({e.release.release_id for e in entries if e.publishes_release} - {logged}))
            self.artifacts.publish(chain.scenario, logged, self.artifacts.fetched_head(chain.scenario), lfs_of=older)

    def _verify(self, scenario: str, release_id: str) -> None:
        try:
            self.artifacts.verify(release_id)
        except MissingArtifact as exc:
            if isinstance(self.commit_logs, JsonlCommitLogs) or self.artifacts.remote is not None:
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


def commit_logs_for(store: ExperienceStore, commits_dir: Path, *, shared: bool = False) -> CommitLogs:
    """The commit-log backend that goes with `store`: the same PostgreSQL database and schema
    for a `PostgresStore` (every front end on it shares the logs), else one JSONL file per
    scenario in `commits_dir` (followed across processes when `shared`)."""
    pg = sys.modules.get("reef.observe.postgres_store")  # loaded if `store` is one; never imported here
    if pg is not None and isinstance(store, pg.PostgresStore):
        from reef.commit.pg_commit_log import PgCommitLogs

        return PgCommitLogs(store.dsn, schema=store.schema)
    return JsonlCommitLogs(commits_dir, shared=shared)


def _is_scenario_name(name: str) -> bool:
    try:
        check_scenario_name(name)
        return True
    except InvalidInput:
        return False


def _check_binding(scenario: str, bound: dict, asked: dict) -> None:
    for key in ("recipe", "starting_release_id"):
        if bound.get(key) != asked.get(key):
            raise Conflict(
                f"scenario {scenario!r} is bound to {key} {bound.get(key)!r}; {asked.get(key)!r} contradicts it"
            )
