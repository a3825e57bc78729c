"""The artifact store's shared remote: the half of `ArtifactStore` (reef/commit/artifacts.py) that
pushes releases to `artifacts.remote` and fetches what other front ends published.

    remote refs/reef/scenarios/<key>   the scenario's latest published release, as locally
    remote refs/reef/lfs/<oid>         one ref per LFS object, pointing at a blob of its bytes

`publish` is one `git push --atomic` of the scenario ref, with the expected old value as a lease
(`--force-with-lease=ref:old`, git's compare-and-swap), and of a ref per LFS object of the
release. A read of a release this clone lacks (commit or LFS object) fetches it first
(`refs/reef/scenarios/*` into `refs/reef/fetched/*`; an LFS object by its ref, written into
`lfs/objects/` as git-lfs would). Every remote call runs on a timeout (`REMOTE_TIMEOUT_S`).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from reef.commit.git_locks import OWNED_AGE_S, SHARED_AGE_S
from reef.core.canonical import check_scenario_name, scenario_key
from reef.core.errors import MissingArtifact, StaleHead, StorageUnavailable

REF_PREFIX = "refs/reef/scenarios/"
FETCHED_PREFIX = "refs/reef/fetched/"  # the remote's scenario refs as of the last fetch
LFS_REF_PREFIX = "refs/reef/lfs/"  # on the remote: one ref per LFS object, at a blob of its bytes
REMOTE_TIMEOUT_S = 120.0  # one push or fetch; past it, StorageUnavailable rather than a hang
# Remote calls keep these from the environment (ssh keys, askpass); user config stays out.
REMOTE_ENV = ("GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_AUTH_SOCK")
_REMOTE_FLAGS = ("-c", "gc.auto=0", "-c", "maintenance.auto=false", "-c", "protocol.version=2")


class RemoteArtifacts:
    """Mixed into `ArtifactStore`, whose repository, locks and git calls it uses."""

    root: Path
    remote: str | None
    _remote_env: dict[str, str]

    def _clear_remote_locks(self, refs: Iterable[str]) -> None:
        """Before a push: locks a killed push left in a remote on a path. Other front ends push
        there too, so only a lock `SHARED_AGE_S` old goes (a URL remote's server is its own; git
        names such a lock in the push's error)."""
        if self.remote is None or _is_url(self.remote):
            return
        for ref in refs:
            self._clear(Path(self.remote, f"{ref}.lock"), SHARED_AGE_S)

    def publish(self, scenario: str, release_id: str, expected_old: str | None, lfs_of: tuple[str, ...] = ()) -> None:
        """Push a release and its LFS objects (and those of `lfs_of`) to the remote, moving the
        scenario's remote ref from `expected_old` by compare-and-swap (`--force-with-lease`),
        all in one atomic push. The caller holds the scenario's commit log, so a remote ref at
        any other value is either a release pushed by a publisher that died before logging it
        (its parent is `expected_old`: replaced, it was never logged), absent (a remote added
        later: pushed whole), or moved by a writer that does not share this commit log
        (`StaleHead`, nothing changes)."""
        assert self.remote is not None
        ref = REF_PREFIX + scenario_key(check_scenario_name(scenario))
        refspecs = [*self._lfs_refspecs((release_id, *lfs_of)), f"{release_id}:{ref}"]
        lease = expected_old
        for attempt in range(2):
            self._clear_remote_locks(spec.split(":", 1)[1] for spec in refspecs)
            r = self._remote_git(
                "push",
                "--porcelain",
                "--atomic",
                "--quiet",
                f"--force-with-lease={ref}:{lease or ''}",
                self.remote,
                *refspecs,
            )
            if r.returncode == 0:
                fetched = FETCHED_PREFIX + scenario_key(scenario)
                with self._fetching():
                    self._clear(self.root / f"{fetched}.lock", OWNED_AGE_S)
                    self._run(["update-ref", fetched, release_id])
                return
            actual = self._remote_ref(ref)
            if actual == release_id:
                return  # an earlier attempt got through
            if attempt == 0 and actual != lease and (actual is None or self._orphan_of(actual, expected_old)):
                lease = actual
                continue
            if actual != lease:
                raise StaleHead(
                    f"scenario {scenario!r}: the artifact remote {self.remote} is at {actual}, not at "
                    f"{lease}: another writer that does not share this commit log moved it"
                )
            error = (r.stderr or r.stdout).decode(errors="replace").strip()
            raise StorageUnavailable(
                f"cannot publish release {release_id} to the artifact remote {self.remote}: {error}"
            )

    def remote_has(self, scenario: str, release_id: str) -> bool:
        """As of the last fetch: the remote's scenario ref is at `release_id` or past it."""
        fetched = FETCHED_PREFIX + scenario_key(check_scenario_name(scenario))
        return self._run(["merge-base", "--is-ancestor", release_id, fetched]).returncode == 0

    def fetched_head(self, scenario: str) -> str | None:
        """The remote's scenario ref as of the last fetch or push."""
        r = self._run(
            ["rev-parse", "--verify", "--quiet", FETCHED_PREFIX + scenario_key(check_scenario_name(scenario))]
        )
        return (r.stdout.decode().strip() or None) if r.returncode == 0 else None

    def fetch(self) -> None:
        """Every scenario ref of the remote (into refs/reef/fetched/*) with the commits behind it."""
        if self.remote is None:
            return
        with self._fetching():
            self._clear_fetch_locks(FETCHED_PREFIX)
            r = self._remote_git(
                "fetch",
                "--quiet",
                "--no-tags",
                "--no-write-fetch-head",
                "--prune",
                self.remote,
                f"+{REF_PREFIX}*:{FETCHED_PREFIX}*",
            )
        if r.returncode != 0:
            error = r.stderr.decode(errors="replace").strip()
            raise StorageUnavailable(f"cannot fetch from the artifact remote {self.remote}: {error}")

    def _has_commit(self, release_id: str) -> bool:
        """Whether the commit is here, fetching from the remote first if it is not."""
        if self._run(["cat-file", "-e", f"{release_id}^{{commit}}"]).returncode == 0:
            return True
        if self.remote is None:
            return False
        self.fetch()
        return self._run(["cat-file", "-e", f"{release_id}^{{commit}}"]).returncode == 0

    def _fetch_missing_lfs(self, pointers: Mapping[str, tuple[str, int]]) -> None:
        """LFS objects of a release that are not here, from the remote (one ref each); what the
        remote lacks stays missing, and the caller names it."""
        if self.remote is None:
            return
        for oid, size in sorted(set(pointers.values())):
            obj = self.lfs_path(oid)
            if obj.is_file() and obj.stat().st_size == size:
                continue
            ref = LFS_REF_PREFIX + oid
            with self._fetching():
                self._clear(self.root / f"{ref}.lock", OWNED_AGE_S)
                r = self._remote_git(
                    "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", self.remote, f"+{ref}:{ref}"
                )
            if r.returncode != 0:
                continue
            data = self._run(["cat-file", "blob", ref]).stdout
            if hashlib.sha256(data).hexdigest() == oid:
                self._store_lfs(oid, data)

    def _lfs_refspecs(self, release_ids: tuple[str, ...]) -> list[str]:
        """`<blob>:refs/reef/lfs/<oid>` for every LFS object of the releases (blobs written here)."""
        oids = sorted({oid for rid in release_ids for oid, _ in self._read(rid)[1].values()})
        if not oids:
            return []
        for oid in oids:
            if not self.lfs_path(oid).is_file():
                raise self._missing_lfs(release_ids[0], "?", oid, self.lfs_path(oid))
        listing = "".join(f"{self.lfs_path(oid)}\n" for oid in oids).encode()
        blobs = self._git("hash-object", "-w", "--no-filters", "--stdin-paths", input=listing).decode().split()
        return [f"{blob}:{LFS_REF_PREFIX}{oid}" for blob, oid in zip(blobs, oids)]

    def _remote_ref(self, ref: str) -> str | None:
        assert self.remote is not None
        r = self._remote_git("ls-remote", self.remote, ref)
        if r.returncode != 0:
            raise StorageUnavailable(
                f"cannot read the artifact remote {self.remote}: {r.stderr.decode(errors='replace').strip()}"
            )
        for line in r.stdout.decode().splitlines():
            sha, name = line.split("\t", 1)
            if name == ref:
                return sha
        return None

    def _orphan_of(self, release_id: str, parent: str | None) -> bool:
        """A commit pushed on top of `parent` (None: a creation) that no log step names."""
        if not self._has_commit(release_id):
            return False
        r = self._run(["rev-parse", "--verify", "--quiet", f"{release_id}^1"])
        return (r.stdout.decode().strip() or None) == parent if r.returncode == 0 else parent is None

    def _nor_remote(self) -> str:
        return f" nor on the artifact remote {self.remote}" if self.remote else ""

    def _missing_lfs(self, release_id: str, path: str, oid: str, obj: Path) -> MissingArtifact:
        return MissingArtifact(
            f"release {release_id}: LFS object {oid} for {path!r} is missing at {obj}{self._nor_remote()}"
        )

    def _remote_git(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        try:
            return _unless_killed(
                subprocess.run(
                    ["git", *_REMOTE_FLAGS, *args],
                    capture_output=True,
                    env=self._remote_env,
                    check=False,
                    timeout=REMOTE_TIMEOUT_S,
                    start_new_session=True,
                ),
                args[0],
            )
        except subprocess.TimeoutExpired:
            raise StorageUnavailable(
                f"git {args[0]} with the artifact remote {self.remote} took over {REMOTE_TIMEOUT_S:.0f} s"
            ) from None
        except OSError as exc:
            raise StorageUnavailable(f"cannot run git: {exc}") from None


def _unless_killed(result: subprocess.CompletedProcess[bytes], command: str) -> subprocess.CompletedProcess[bytes]:
    """A git killed by a signal says nothing about the repository: a server-side fault (503), never
    "not found" (a read's failure is otherwise taken for a missing release)."""
    if result.returncode < 0:
        raise StorageUnavailable(f"git {command} was killed by signal {-result.returncode}; try again")
    return result


def remote_location(remote: str | Path) -> str:
    """A git URL as given; a path (anything else) made absolute."""
    text = str(remote).strip()
    return text if _is_url(text) else str(Path(text).expanduser().absolute())


def _is_url(remote: str) -> bool:
    """`scheme://...`, or git's scp-like `[user@]host:path` (a colon before any slash)."""
    return "://" in remote or bool(re.match(r"^[^/:]+:", remote)) and not re.match(r"^[A-Za-z]:[\\/]", remote)
