"""The artifact store: the content of every release, in a bare git repository.

Layout under `root` (e.g. `<state>/artifacts.git`):

    refs/reef/scenarios/<scenario_key>    one ref per scenario: the commit of its latest release
    lfs/objects/ab/cd/abcd...             large binaries, by sha256, in git-lfs's own layout

Every commit holds the content plus two files of ours: `reef-artifact.json` (the manifest:
content id, parent release, kind, source, metadata) and `.gitattributes`, which marks
`*.safetensors`, `*.bin` and `*.pt` as LFS files. Those are committed as Git-LFS pointer files
and their bytes are written beside the repository exactly where git-lfs would put them, so plain
git suffices here, and a user with git-lfs can push the repository to any LFS remote as is.

A commit's sha is the `release_id`; `content_id` hashes the content alone, so equal content has
equal ids whatever git or LFS do. Refs move only by compare-and-swap (`git update-ref NEW OLD`).

With a remote (`artifacts.remote`: a git URL, or the path of a bare repository every front end
reaches), the store is shared by every front end of a deployment:

    remote refs/reef/scenarios/<key>   the scenario's latest published release, as locally
    remote refs/reef/lfs/<oid>         one ref per LFS object, pointing at a blob of its bytes

`commit` publishes before it returns: one `git push --atomic` of the scenario ref, with the
expected old value as a lease (`--force-with-lease=ref:old`, git's compare-and-swap), and of a
ref per LFS object of the release. The caller appends the commit-log step only after that, so a
release the log names is always on the remote. A read of a release this clone lacks (commit or
LFS object) fetches it first (`refs/reef/scenarios/*` into `refs/reef/fetched/*`; an LFS object
by its ref, written into `lfs/objects/` as git-lfs would); what the remote lacks too is named in
the `MissingArtifact` error. That half of the store is `reef/commit/artifact_remote.py`.

A git killed while it moved a ref leaves `<ref>.lock`, which would fail every later move of that
ref: each git write first removes such a lock while holding what proves its writer dead
(`reef/commit/git_locks.py`): a scenario's ref under its commit log (every caller of `commit`
and `reset_scenario_head` holds it), `refs/reef/fetched/*` and the local `refs/reef/lfs/*`
under the repository's fetch lock (`reef-fetch.flock`, a `flock` every process sharing the
repository takes), a remote's refs (a path remote) by age alone. `cleared_locks` lists what was
removed. Git runs in a session of its own, so a kill of Reef's process group does not reach it:
it finishes its ref update and leaves no lock.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reef.commit.artifact_remote import (
    FETCHED_PREFIX,
    LFS_REF_PREFIX,
    REF_PREFIX,
    REMOTE_ENV,
    RemoteArtifacts,
    _is_url,
    _unless_killed,
    remote_location,
)
from reef.commit.git_locks import OWNED_AGE_S, SHARED_AGE_S, StaleLock, clear_stale, locks_under
from reef.core.canonical import check_scenario_name, content_id_of, new_id, scenario_key
from reef.core.errors import Corruption, InvalidInput, MissingArtifact, StaleHead, StorageUnavailable
from reef.core.training import TRAINING_FOLDER
from reef.core.types import ArtifactKind

MANIFEST_NAME = "reef-artifact.json"
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS).encode()
LFS_VERSION = "version https://git-lfs.github.com/spec/v1"
ARCHIVED_PREFIX = "refs/reef/archived/"  # archived scenarios' refs: <key>/<stamp>
FETCH_LOCK_NAME = "reef-fetch.flock"  # held (flock) by every write of refs/reef/fetched/* and local refs/reef/lfs/*
_ZERO = "0" * 40
_SHA = re.compile(r"^[0-9a-f]{40}$")
_POINTER = re.compile(rf"^{re.escape(LFS_VERSION)}\noid sha256:([0-9a-f]{{64}})\nsize ([0-9]+)\n$")
# Names git itself gives meaning to; content may not shadow them at any depth.
_RESERVED = {".git", ".gitattributes", ".gitmodules"}
_CONFIG = {
    "core.hooksPath": os.devnull,
    "core.logAllRefUpdates": "always",  # a reflog per scenario ref
    "core.filesRefLockTimeout": "1000",
    "core.fsync": "committed",  # objects and refs reach the disk before the commit log names them
    "gc.pruneExpire": "never",  # a release the commit log names is never pruned, even off its ref
    "gc.reflogExpire": "never",
    "gc.reflogExpireUnreachable": "never",
    "user.name": "reef",
    "user.email": "reef@localhost",
}


@dataclass(frozen=True)
class ArtifactManifest:
    content_id: str
    parent_release_id: str | None
    kind: str  # an ArtifactKind value
    source: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", ArtifactKind(self.kind).value)
        except ValueError:
            raise InvalidInput(f"artifact kind must be weights, harness, both or empty, got {self.kind!r}")
        if not isinstance(self.content_id, str) or not self.content_id.startswith("sha256:"):
            raise InvalidInput(f"content_id must be 'sha256:<hex>', got {self.content_id!r}")
        if not isinstance(self.source, dict) or not isinstance(self.metadata, dict):
            raise InvalidInput("manifest source and metadata must be JSON objects")
        if self.parent_release_id is not None and not isinstance(self.parent_release_id, str):
            raise InvalidInput(f"parent_release_id must be a string or None, got {self.parent_release_id!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "content_id": self.content_id,
            "parent_release_id": self.parent_release_id,
            "kind": self.kind,
            "source": self.source,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ArtifactManifest:
        try:
            return cls(d["content_id"], d.get("parent_release_id"), d["kind"], d["source"], d["metadata"])
        except (KeyError, TypeError) as exc:
            raise InvalidInput(f"artifact manifest needs content_id, kind, source, metadata: {exc!r}") from None


def is_lfs_path(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) for p in LFS_PATTERNS)


def lfs_pointer(oid: str, size: int) -> bytes:
    return f"{LFS_VERSION}\noid sha256:{oid}\nsize {size}\n".encode()


def _check_files(files: Mapping[str, bytes]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for path, data in files.items():
        parts = path.split("/") if isinstance(path, str) else []
        if (
            not parts
            or "\0" in path
            or "\\" in path
            or any(p in ("", ".", "..") or p.lower() in _RESERVED for p in parts)
            or path == MANIFEST_NAME
        ):
            raise InvalidInput(f"artifact path must be a relative POSIX path, not reserved, got {path!r}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput(f"artifact file {path!r} must be bytes")
        out[path] = bytes(data)
    for path in out:  # "a" and "a/b" cannot both be files
        for i in range(len(path)):
            if path[i] == "/" and path[:i] in out:
                raise InvalidInput(f"artifact path {path[:i]!r} is both a file and a directory")
    return out


def _check_sha(value: object, what: str) -> str:
    if not isinstance(value, str) or not _SHA.fullmatch(value):
        raise InvalidInput(f"{what} must be a 40-hex commit sha, got {value!r}")
    return value


def require_git() -> None:
    """The artifact store is a git repository: without the `git` binary Reef cannot keep a
    release, so `reef serve` and `ReefState.open` stop at once, naming what is missing."""
    if shutil.which("git") is None:
        raise StorageUnavailable(
            "Reef needs the `git` program (its artifact store is a git repository) and none is "
            "on PATH: install git (e.g. apt-get install git), then start again"
        )


class ArtifactStore(RemoteArtifacts):
    def __init__(self, root: Path, remote: str | Path | None = None) -> None:
        require_git()
        self.root = Path(root).absolute()
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        # User and system config (hooks, lfs filters, signing, templates) stay out of every call.
        self._env.update(GIT_DIR=str(self.root), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
        self._env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_AUTHOR_NAME="reef", GIT_COMMITTER_NAME="reef")
        self._env.update(GIT_AUTHOR_EMAIL="reef@localhost", GIT_COMMITTER_EMAIL="reef@localhost")
        if not (self.root / "HEAD").is_file():
            self._init(self.root)
        (self.root / "lfs" / "tmp").mkdir(parents=True, exist_ok=True)
        self._remote_env = {**self._env, **{k: os.environ[k] for k in REMOTE_ENV if k in os.environ}}
        self._fetch_lock = threading.Lock()
        self.cleared_locks: list[StaleLock] = []  # stale git locks this store removed
        self.remote: str | None = None
        if remote is not None and str(remote).strip():
            self.remote = remote_location(remote)
            if not _is_url(self.remote) and not (Path(self.remote) / "HEAD").is_file():
                self._init(Path(self.remote))  # a shared path: the first front end creates it

    def _init(self, root: Path) -> None:
        """Build a bare repository beside root, then rename it into place: a crash leaves none or all."""
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{root.name}.init-", dir=root.parent)
        try:
            self._git("init", "--bare", "--quiet", "--template=", env={"GIT_DIR": tmp})
            for key, value in _CONFIG.items():
                self._git("config", key, value, env={"GIT_DIR": tmp})
            try:
                os.rename(tmp, root)  # replaces an empty directory, fails on a non-empty one
            except OSError:
                if not (root / "HEAD").is_file():  # not merely another process that won
                    raise StorageUnavailable(f"cannot create an artifact repository at {root}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- writing -------------------------------------------------------------------------------

    def commit(
        self, scenario: str, files: Mapping[str, bytes], manifest: ArtifactManifest, expected_parent: str | None
    ) -> str:
        """Commit content + manifest on top of expected_parent and move the scenario's ref by CAS."""
        check_scenario_name(scenario)
        if expected_parent is not None:
            _check_sha(expected_parent, "expected parent")
        content = _check_files(files)
        if manifest.content_id != content_id_of(content):
            raise InvalidInput(f"manifest content_id {manifest.content_id} does not match the files")
        try:
            manifest_text = json.dumps(manifest.to_json(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"manifest must be plain JSON: {exc}") from None
        blobs: dict[str, bytes] = {}
        for path, data in content.items():
            if is_lfs_path(path) and data:  # git-lfs keeps an empty file as an empty file
                oid = hashlib.sha256(data).hexdigest()
                self._store_lfs(oid, data)
                data = lfs_pointer(oid, len(data))
            blobs[path] = data
        blobs[".gitattributes"] = GITATTRIBUTES
        blobs[MANIFEST_NAME] = manifest_text.encode()
        with tempfile.TemporaryDirectory(prefix="reef-commit-") as tmp:
            paths = sorted(blobs)
            for i, path in enumerate(paths):
                Path(tmp, str(i)).write_bytes(blobs[path])
            listing = "".join(f"{tmp}/{i}\n" for i in range(len(paths))).encode()
            oids = self._git("hash-object", "-w", "--no-filters", "--stdin-paths", input=listing).split()
            index_info = "".join(f"100644 {oid.decode()}\t{path}\0" for oid, path in zip(oids, paths)).encode()
            env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}  # each call its own index
            self._git("update-index", "-z", "--index-info", input=index_info, env=env)
            tree = self._git("write-tree", env=env).decode().strip()
        message = (
            f"reef: {manifest.kind} release for scenario {scenario}\n\n"
            f"Content-Id: {manifest.content_id}\nReef-Scenario: {scenario}\nReef-Nonce: {new_id()}\n"
        )
        parent_args = ["-p", expected_parent] if expected_parent else []
        try:
            new = self._git("commit-tree", tree, *parent_args, input=message.encode()).decode().strip()
        except StorageUnavailable:
            self._raise_if_stale(scenario, expected_parent)
            raise
        ref = REF_PREFIX + scenario_key(scenario)
        self.clear_scenario_lock(scenario)
        error = ""
        for attempt in range(5):
            r = self._run(["update-ref", "-m", "reef: commit", ref, new, expected_parent or _ZERO])
            if r.returncode == 0:
                if self.remote is not None:
                    self.publish(scenario, new, expected_parent)
                return new
            self._raise_if_stale(scenario, expected_parent)
            error = r.stderr.decode(errors="replace").strip()
            time.sleep(0.02 * (attempt + 1))  # another writer holds the ref lock; it may yet fail
        raise StorageUnavailable(f"cannot move {ref}: {error}")

    def reset_scenario_head(self, scenario: str, release_id: str | None) -> None:
        """Force the scenario's ref (recovery repairs git from the commit log); None deletes it.
        The caller holds the scenario's commit log, as for `commit`."""
        ref = REF_PREFIX + scenario_key(check_scenario_name(scenario))
        self.clear_scenario_lock(scenario)
        if release_id is None:
            self._clear(self.root / "packed-refs.lock", SHARED_AGE_S)  # a deletion locks packed-refs too
            self._git("update-ref", "-m", "reef: reset", "-d", ref)
            return
        _check_sha(release_id, "release id")
        if not self._has_commit(release_id):
            raise MissingArtifact(f"release {release_id} is not in the artifact store{self._nor_remote()}")
        self._git("update-ref", "-m", "reef: reset", ref, release_id)

    def archive_scenario_head(self, scenario: str, stamp: str) -> str | None:
        """Move the scenario's ref aside to `refs/reef/archived/<key>/<stamp>`, so its releases
        stay reachable (nothing is deleted) and a new scenario of the name starts without one;
        the release it named. The caller holds the scenario's commit log, as for `commit`."""
        head = self.scenario_head(scenario)
        if head is not None:
            self._git("update-ref", "-m", "reef: archive", f"{ARCHIVED_PREFIX}{scenario_key(scenario)}/{stamp}", head)
            self.reset_scenario_head(scenario, None)
        return head

    # -- stale git locks (reef/commit/git_locks.py) -------------------------------------------

    def scenario_lock(self, scenario: str) -> Path:
        """Where git locks the scenario's ref while it moves it."""
        return self.root / f"{REF_PREFIX}{scenario_key(check_scenario_name(scenario))}.lock"

    def clear_scenario_lock(self, scenario: str) -> None:
        """Remove a lock a killed git left on the scenario's ref. Only with the scenario's commit
        log held: every Reef writer of the ref holds it, so the lock can only be a dead git's."""
        self._clear(self.scenario_lock(scenario), OWNED_AGE_S)

    def leftover_locks(self) -> list[str]:
        """Lock files in the repository now (none unless a git is running or was killed)."""
        found = locks_under(self.root / "refs")
        if (self.root / "packed-refs.lock").exists():
            found.append(self.root / "packed-refs.lock")
        return [str(p) for p in found]

    def clear_fetch_locks(self) -> None:
        """Remove locks a killed fetch left on `refs/reef/fetched/*` or the local `refs/reef/lfs/*`
        (recovery: a fetch there would fail on them, and so would starting)."""
        with self._fetching():
            self._clear_fetch_locks(FETCHED_PREFIX, LFS_REF_PREFIX)

    def _clear_fetch_locks(self, *prefixes: str) -> None:
        """With the fetch lock held."""
        for prefix in prefixes:
            for lock in locks_under(self.root / prefix):
                self._clear(lock, OWNED_AGE_S)
        self._clear(self.root / "packed-refs.lock", SHARED_AGE_S)  # a fetch's --prune deletes refs

    def _clear(self, lock: Path, min_age_s: float) -> None:
        cleared = clear_stale(lock, min_age_s)
        if cleared is not None:
            self.cleared_locks.append(cleared)

    @contextmanager
    def _fetching(self) -> Iterator[None]:
        """Hold the repository's fetch lock: a lock for this process's threads, a `flock` for
        the other processes sharing the repository (`--workers` on one state directory). Every
        write of `refs/reef/fetched/*` and of the local `refs/reef/lfs/*` happens under it, so a
        git lock found there meanwhile is a dead git's."""
        with self._fetch_lock:
            try:
                fd = os.open(self.root / FETCH_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StorageUnavailable(f"cannot open {self.root / FETCH_LOCK_NAME}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _raise_if_stale(self, scenario: str, expected_parent: str | None) -> None:
        head = self.scenario_head(scenario)
        if head != expected_parent:
            raise StaleHead(f"scenario {scenario!r} is at {head}, not at the expected {expected_parent}")

    def _store_lfs(self, oid: str, data: bytes) -> None:
        path = self.lfs_path(oid)
        if path.is_file() and path.stat().st_size == len(data):
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root / "lfs" / "tmp", prefix=oid[:16] + "-")
        except OSError as exc:
            raise StorageUnavailable(f"cannot store LFS object {oid} in {self.root}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o644)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:  # ENOSPC, EDQUOT, EIO: the store cannot take writes now
            Path(tmp).unlink(missing_ok=True)
            raise StorageUnavailable(f"cannot store LFS object {oid} in {self.root}: {exc}") from exc
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # -- reading -------------------------------------------------------------------------------

    def lfs_path(self, oid: str) -> Path:
        return self.root / "lfs" / "objects" / oid[0:2] / oid[2:4] / oid

    def scenario_head(self, scenario: str) -> str | None:
        ref = REF_PREFIX + scenario_key(check_scenario_name(scenario))
        r = self._run(["rev-parse", "--verify", "--quiet", ref])
        return (r.stdout.decode().strip() or None) if r.returncode == 0 else None

    def has_release(self, release_id: str) -> bool:
        try:
            self.verify(release_id)
        except MissingArtifact:
            return False
        return True

    def compacted(self, path: str, oid: str) -> bool:
        """Whether `path`'s LFS object is optimiser state compaction freed (`reef compact`): the
        release reads without it (reef/commit/weights_store.py)."""
        marked = (self.root / "lfs" / "compacted" / oid).exists()
        return path.startswith(TRAINING_FOLDER) and marked and not self.lfs_path(oid).is_file()

    def lfs_pointers(self, release_id: str) -> tuple[list[str], dict[str, tuple[str, int]]]:
        """A release's content paths, and its LFS pointers (oid, size) by path, without their bytes."""
        blobs, pointers = self._read(release_id)
        return sorted(blobs), pointers

    def verify(self, release_id: str) -> None:
        """The commit, its manifest and every LFS object it points to exist (compacted ones aside)."""
        _, pointers = self._read(release_id)
        pointers = {path: p for path, p in pointers.items() if not self.compacted(path, p[0])}
        self._fetch_missing_lfs(pointers)
        for path, (oid, size) in pointers.items():
            obj = self.lfs_path(oid)
            if not obj.is_file() or obj.stat().st_size != size:
                raise self._missing_lfs(release_id, path, oid, obj)

    def manifest(self, release_id: str) -> ArtifactManifest:
        blob = f"{_check_release(release_id)}^{{commit}}:{MANIFEST_NAME}"
        self._has_commit(release_id)  # fetched first, if a remote has it
        r = self._run(["cat-file", "blob", blob])
        if r.returncode != 0:
            raise MissingArtifact(
                f"release {release_id} is not in the artifact store or has no manifest{self._nor_remote()}"
            )
        return self._parse_manifest(release_id, r.stdout)

    def files(self, release_id: str) -> dict[str, bytes]:
        """The content (no manifest, no .gitattributes), LFS pointers resolved to their bytes;
        optimiser state that compaction freed is left out."""
        blobs, pointers = self._read(release_id)
        for path in [path for path, (oid, _) in pointers.items() if self.compacted(path, oid)]:
            del blobs[path], pointers[path]
        self._fetch_missing_lfs(pointers)
        for path, (oid, size) in pointers.items():
            obj = self.lfs_path(oid)
            try:
                data = obj.read_bytes()
            except FileNotFoundError:
                raise self._missing_lfs(release_id, path, oid, obj) from None
            if len(data) != size or hashlib.sha256(data).hexdigest() != oid:
                raise Corruption(str(obj), None, f"LFS object does not hash to {oid} (release {release_id})")
            blobs[path] = data
        return blobs

    def checkout(self, release_id: str, dest: Path) -> Path:
        dest = Path(dest)
        files = self.files(release_id)
        dest.mkdir(parents=True, exist_ok=True)
        for path, data in files.items():
            _check_files({path: data})  # never write outside dest, whatever the repository holds
            target = dest.joinpath(*path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return dest

    def diff(self, old_release_id: str, new_release_id: str) -> str:
        """`git diff` between two releases; LFS files show as pointer changes."""
        old, new = _check_release(old_release_id), _check_release(new_release_id)
        self._has_commit(old), self._has_commit(new)
        r = self._run(
            ["diff", "--no-color", "--no-ext-diff", "--no-textconv", f"{old}^{{commit}}", f"{new}^{{commit}}"]
        )
        if r.returncode != 0:
            raise MissingArtifact(f"cannot diff {old}..{new}: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout.decode("utf-8", errors="replace")

    def content_diff(self, old_release_id: str | None, new_release_id: str) -> tuple[list[str], str]:
        """The content paths that changed and their unified diff, without Reef's own files (the
        manifest, .gitattributes); `None` for old diffs against nothing. LFS files show as
        pointer changes (oid and size), never as binary bytes."""
        for release in (old_release_id, new_release_id):
            if release:
                self._has_commit(_check_release(release))
        new = _check_release(new_release_id) + "^{commit}"
        old = _check_release(old_release_id) + "^{commit}" if old_release_id else self._empty_tree()
        args = [
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            old,
            new,
            "--",
            ".",
            f":(exclude){MANIFEST_NAME}",
            ":(exclude).gitattributes",
        ]
        names = self._run([*args[:5], "--name-only", "-z", *args[5:]])
        patch = self._run(args)
        for r in (names, patch):
            if r.returncode != 0:
                raise MissingArtifact(f"cannot diff {old}..{new}: {r.stderr.decode(errors='replace').strip()}")
        changed = [p.decode("utf-8", errors="replace") for p in names.stdout.split(b"\0") if p]
        return changed, patch.stdout.decode("utf-8", errors="replace")

    def _empty_tree(self) -> str:
        return self._git("mktree", input=b"").decode().strip()

    def _read(self, release_id: str) -> tuple[dict[str, bytes], dict[str, tuple[str, int]]]:
        """The content blobs of a release (pointers unresolved) and its LFS pointers by path."""
        sha = _check_release(release_id)
        r = self._run(["ls-tree", "-r", "-z", "--full-tree", f"{sha}^{{commit}}"])
        if r.returncode != 0 and self.remote is not None:
            self.fetch()  # published by another front end: the remote has it
            r = self._run(["ls-tree", "-r", "-z", "--full-tree", f"{sha}^{{commit}}"])
        if r.returncode != 0:
            raise MissingArtifact(f"release {release_id} is not in the artifact store{self._nor_remote()}")
        entries: list[tuple[str, str]] = []
        for item in r.stdout.split(b"\0"):
            if item:
                meta, raw = item.split(b"\t", 1)
                _, kind, oid = meta.decode().split()
                path = raw.decode("utf-8", errors="surrogateescape")
                if kind == "blob" and path != ".gitattributes":
                    entries.append((oid, path))
        batch = self._git("cat-file", "--batch", input="".join(f"{oid}\n" for oid, _ in entries).encode())
        blobs: dict[str, bytes] = {}
        pos = 0
        for oid, path in entries:
            end = batch.index(b"\n", pos)
            header = batch[pos:end].decode().split()
            if len(header) != 3:
                raise MissingArtifact(f"release {release_id}: git object {oid} for {path!r} is missing")
            size = int(header[2])
            blobs[path] = batch[end + 1 : end + 1 + size]
            pos = end + 2 + size
        if MANIFEST_NAME not in blobs:
            raise MissingArtifact(f"release {release_id} has no {MANIFEST_NAME}")
        self._parse_manifest(release_id, blobs.pop(MANIFEST_NAME))
        pointers: dict[str, tuple[str, int]] = {}
        for path, data in blobs.items():  # git-lfs: only pattern paths, and a pointer is under 1 KiB
            m = _POINTER.fullmatch(data.decode("ascii", "replace")) if is_lfs_path(path) and len(data) < 1024 else None
            if m:
                pointers[path] = (m.group(1), int(m.group(2)))
        return blobs, pointers

    def _parse_manifest(self, release_id: str, data: bytes) -> ArtifactManifest:
        try:
            return ArtifactManifest.from_json(json.loads(data))
        except (ValueError, InvalidInput, TypeError) as exc:
            raise Corruption(f"{self.root}@{release_id}:{MANIFEST_NAME}", None, str(exc)) from None

    # -- git -----------------------------------------------------------------------------------

    def _run(
        self, args: list[str], input: bytes | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        try:
            env = {**self._env, **(env or {})}
            # its own session: a kill of Reef's process group lets it finish (no lock left behind)
            result = subprocess.run(
                ["git", *args], input=input, capture_output=True, env=env, check=False, start_new_session=True
            )
        except OSError as exc:
            raise StorageUnavailable(f"cannot run git: {exc}") from None
        return _unless_killed(result, args[0])

    def _git(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
        r = self._run(list(args), input=input, env=env)
        if r.returncode != 0:
            error = r.stderr.decode(errors="replace").strip()
            raise StorageUnavailable(f"git {args[0]} failed in {self.root}: {error}")
        return r.stdout


def _check_release(release_id: object) -> str:
    """A read of something that is not a commit sha finds nothing."""
    if not isinstance(release_id, str) or not _SHA.fullmatch(release_id):
        raise MissingArtifact(f"release {release_id!r} is not in the artifact store")
    return release_id
