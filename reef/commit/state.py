"""The state directory: the experience store, the artifact store and every scenario's chain.

    <state>/experience.db         records and reports (SQLite; or a PostgreSQL store given in)
    <state>/artifacts.git/        bare git repository, one ref per scenario, LFS objects inside
    <state>/commits/<key>.jsonl   one commit log per scenario (key: urlsafe base64 of the name)

Opening it is recovery: every log is read (a torn last line truncated, other damage an error
naming file and line), each scenario's head must have its artifact (else `MissingArtifact`
naming it), each scenario's git ref is repaired from its log, and logged compactions are
applied again (a crash may have come between the log line and the delete).

Older releases are checked when their content is read (`ArtifactStore.files` refuses a missing
or corrupted artifact, naming the release), not at open: checking them all made every restart
as slow as the chain was long. `verify_artifacts` checks them all (`reef inspect` runs it).
"""

from __future__ import annotations

import threading
from pathlib import Path

from reef.commit.artifacts import ArtifactManifest, ArtifactStore
from reef.commit.commit_log import CommitLog
from reef.commit.release_chain import Candidate, ReleaseChain, last_artifact_release
from reef.core.canonical import check_scenario_name, scenario_key
from reef.core.errors import Conflict, Corruption, NotFound
from reef.core.types import ArtifactKind, CommitEntry, Operation, ReleaseRef
from reef.observe.sqlite_store import SQLiteStore
from reef.observe.store import ExperienceStore

EMPTY = Candidate({}, ArtifactKind.EMPTY, {"kind": "empty"})


class ReefState:
    def __init__(self, root: Path | str, store: ExperienceStore | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.commits_dir = self.root / "commits"
        self.commits_dir.mkdir(exist_ok=True)
        self.store = store if store is not None else SQLiteStore(self.root / "experience.db")
        self.artifacts = ArtifactStore(self.root / "artifacts.git")
        self._lock = threading.Lock()
        self._chains: dict[str, ReleaseChain] = {}
        self._recover()

    @classmethod
    def open(cls, root: Path | str, store: ExperienceStore | None = None) -> ReefState:
        return cls(root, store)

    def close(self) -> None:
        with self._lock:
            for chain in self._chains.values():
                chain.log.close()
            self._chains.clear()
        self.store.close()

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
        log = CommitLog(self.commits_dir / f"{scenario_key(scenario)}.jsonl", scenario=scenario)
        return ReleaseChain(scenario, log, self.artifacts)

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
        for path in sorted(self.commits_dir.glob("*.jsonl")):
            log = CommitLog(path)
            entries = log.entries()
            if not entries:
                log.close()  # a creation that crashed before its first line
                continue
            scenario = entries[0].scenario
            if scenario_key(scenario) != path.stem or entries[0].operation is not Operation.CREATION:
                log.close()
                raise Corruption(str(path), 1, "the first line must be the creation of the scenario the file is named for")
            log.scenario = scenario
            chain = ReleaseChain(scenario, log, self.artifacts)
            logged = last_artifact_release(entries)
            for release_id in {chain.head().release_id, logged}:  # served, and mirrored by the git ref
                self.artifacts.verify(release_id)
            if self.artifacts.scenario_head(scenario) != logged:
                self.artifacts.reset_scenario_head(scenario, logged)
            compacted = [rid for entry in entries for rid in entry.compacted_ids]
            if compacted:
                self.store.compact(scenario, compacted)
            self._chains[scenario] = chain


def _check_binding(scenario: str, bound: dict, asked: dict) -> None:
    for key in ("recipe", "starting_release_id"):
        if bound.get(key) != asked.get(key):
            raise Conflict(
                f"scenario {scenario!r} is bound to {key} {bound.get(key)!r}; {asked.get(key)!r} contradicts it"
            )
