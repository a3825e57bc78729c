"""The git-backed artifact store, on real git repositories."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path

import pytest

from reef.commit.artifacts import (
    LFS_PATTERNS,
    MANIFEST_NAME,
    REF_PREFIX,
    ArtifactManifest,
    ArtifactStore,
    content_id_of,
)
from reef.core.canonical import scenario_key
from reef.core.errors import InvalidInput, MissingArtifact, StaleHead, StorageUnavailable
from reef.core.types import ArtifactKind

ADAPTER = os.urandom(1 << 20)
HARNESS = {"prompts/system.md": b"You are helpful.\n", "rules.txt": b"one\ntwo\n"}


def manifest_for(files: dict[str, bytes], parent: str | None = None, kind: str = "harness") -> ArtifactManifest:
    return ArtifactManifest(content_id_of(files), parent, kind, {"kind": "empty"}, {"note": "test"})


# git as a user without git-lfs would run it: no help from the store, no user config.
PLAIN_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def plain_git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(root), *args], check=True, capture_output=True, text=True, env=PLAIN_ENV
    ).stdout


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts.git")


def commit(store: ArtifactStore, files: dict[str, bytes], parent: str | None, scenario: str = "s1") -> str:
    return store.commit(scenario, files, manifest_for(files, parent), parent)


def test_content_id_is_a_hash_of_the_content_alone() -> None:
    a = content_id_of({"a.txt": b"x", "b/c.txt": b"y"})
    assert a == content_id_of({"b/c.txt": b"y", "a.txt": b"x"})
    assert a.startswith("sha256:") and len(a) == len("sha256:") + 64
    assert a != content_id_of({"a.txt": b"x", "b/c.txt": b"z"})
    assert a != content_id_of({"a.txt": b"x", "b/d.txt": b"y"})
    assert content_id_of({}) != content_id_of({"a": b""})


def test_round_trip_with_an_lfs_file(store: ArtifactStore, tmp_path: Path) -> None:
    files = {**HARNESS, "adapter/adapter_model.safetensors": ADAPTER, "adapter/config.json": b"{}"}
    release = store.commit("s1", files, manifest_for(files, kind="both"), None)
    assert store.scenario_head("s1") == release
    assert store.files(release) == files
    assert store.manifest(release) == manifest_for(files, kind="both")
    assert store.manifest(release).kind == ArtifactKind.BOTH.value
    store.verify(release)
    assert store.has_release(release)

    oid = hashlib.sha256(ADAPTER).hexdigest()
    pointer = plain_git(store.root, "cat-file", "-p", f"{release}:adapter/adapter_model.safetensors")
    assert pointer == f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(ADAPTER)}\n"
    obj = store.root / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    assert hashlib.sha256(obj.read_bytes()).hexdigest() == oid

    out = store.checkout(release, tmp_path / "co")
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() == ADAPTER
    assert (out / "prompts" / "system.md").read_bytes() == HARNESS["prompts/system.md"]
    assert not (out / MANIFEST_NAME).exists() and not (out / ".gitattributes").exists()


def test_every_commit_carries_manifest_and_gitattributes(store: ArtifactStore) -> None:
    first = commit(store, HARNESS, None)
    second = commit(store, {**HARNESS, "rules.txt": b"one\nthree\n"}, first)
    for release in (first, second):
        names = plain_git(store.root, "ls-tree", "--name-only", release).split()
        assert MANIFEST_NAME in names and ".gitattributes" in names
        attrs = plain_git(store.root, "cat-file", "-p", f"{release}:.gitattributes")
        for pattern in LFS_PATTERNS:
            assert f"{pattern} filter=lfs diff=lfs merge=lfs -text" in attrs.splitlines()
    assert plain_git(store.root, "rev-parse", f"{second}^").strip() == first
    assert store.manifest(second).parent_release_id == first


def test_empty_content_and_equal_content_get_distinct_releases(store: ArtifactStore) -> None:
    a = store.commit("a", {}, ArtifactManifest(content_id_of({}), None, "empty", {"kind": "empty"}, {}), None)
    b = store.commit("b", {}, ArtifactManifest(content_id_of({}), None, "empty", {"kind": "empty"}, {}), None)
    assert a != b  # two decisions, one content
    assert store.files(a) == store.files(b) == {}
    assert store.manifest(a).content_id == store.manifest(b).content_id


def test_stale_parent_is_refused_and_the_ref_stays(store: ArtifactStore) -> None:
    first = commit(store, HARNESS, None)
    second = commit(store, {"rules.txt": b"2\n"}, first)
    with pytest.raises(StaleHead):
        commit(store, {"rules.txt": b"3\n"}, first)
    with pytest.raises(StaleHead):
        commit(store, {"rules.txt": b"3\n"}, None)  # None means the ref must not exist
    with pytest.raises(StaleHead):
        commit(store, {"rules.txt": b"3\n"}, "1" * 40)  # a parent that is no commit at all
    assert store.scenario_head("s1") == second
    assert store.scenario_head("other") is None


def test_racing_commits_on_one_parent_exactly_one_wins(store: ArtifactStore) -> None:
    base = commit(store, HARNESS, None)
    barrier = threading.Barrier(8)
    wins: list[str] = []
    stale: list[int] = []

    def attempt(i: int) -> None:
        files = {"rules.txt": f"thread {i}\n".encode(), "w.pt": bytes([i]) * 1000}
        barrier.wait()
        try:
            wins.append(commit(store, files, base))
        except StaleHead:
            stale.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(stale) == 7
    assert store.scenario_head("s1") == wins[0]
    assert store.has_release(wins[0])


def test_concurrent_commits_on_different_scenarios_all_land(store: ArtifactStore) -> None:
    results: dict[str, str] = {}

    def run(name: str) -> None:
        head = None
        for step in range(3):
            head = commit(store, {"f.txt": f"{name} {step}\n".encode()}, head, scenario=name)
        results[name] = head

    threads = [threading.Thread(target=run, args=(f"sc{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {n: store.scenario_head(n) for n in results} == results
    assert all(store.files(h) == {"f.txt": f"{n} 2\n".encode()} for n, h in results.items())


def test_missing_lfs_object_and_unknown_release(store: ArtifactStore) -> None:
    files = {"model.bin": b"weights" * 100}
    release = commit(store, files, None)
    oid = hashlib.sha256(files["model.bin"]).hexdigest()
    (store.root / "lfs" / "objects" / oid[:2] / oid[2:4] / oid).unlink()
    assert not store.has_release(release)
    with pytest.raises(MissingArtifact) as exc:
        store.verify(release)
    assert oid in str(exc.value) and release in str(exc.value) and "model.bin" in str(exc.value)
    with pytest.raises(MissingArtifact, match=oid):
        store.files(release)
    assert store.manifest(release).content_id == content_id_of(files)  # git itself is intact

    unknown = "0123456789abcdef0123456789abcdef01234567"
    assert not store.has_release(unknown)
    for call in (store.verify, store.files, store.manifest):
        with pytest.raises(MissingArtifact, match=unknown):
            call(unknown)
    assert not store.has_release("not-a-sha")
    blob = plain_git(store.root, "rev-parse", f"{release}:{MANIFEST_NAME}").strip()
    assert not store.has_release(blob)  # an object that is not a commit is no release


def test_diff_shows_changed_lines_and_pointer_changes(store: ArtifactStore) -> None:
    first = commit(store, {**HARNESS, "a.safetensors": b"old"}, None)
    second = commit(store, {**HARNESS, "rules.txt": b"one\nthree\n", "a.safetensors": b"new"}, first)
    text = store.diff(first, second)
    assert "-two" in text and "+three" in text
    assert f"+oid sha256:{hashlib.sha256(b'new').hexdigest()}" in text
    assert store.diff(first, first) == ""
    with pytest.raises(MissingArtifact):
        store.diff(first, "f" * 40)


@pytest.mark.parametrize(
    "path",
    [
        "/abs",
        "../up",
        "a/../b",
        "a//b",
        "./a",
        "a/",
        "",
        ".git/config",
        "x/.git/y",
        ".GIT/x",
        ".gitattributes",
        "sub/.gitmodules",
        MANIFEST_NAME,
        "a\\b",
        "nul\0",
    ],
)
def test_bad_paths_are_refused(store: ArtifactStore, path: str) -> None:
    files = {path: b"x"}
    with pytest.raises(InvalidInput):
        store.commit("s1", files, manifest_for(files), None)
    assert store.scenario_head("s1") is None


def test_bad_input_is_refused(store: ArtifactStore) -> None:
    with pytest.raises(InvalidInput):
        store.commit("s1", HARNESS, manifest_for({"other": b""}), None)  # content id does not match
    with pytest.raises(InvalidInput):
        store.commit("s1", {"a": b"1", "a/b": b"2"}, manifest_for({"a": b"1", "a/b": b"2"}), None)
    with pytest.raises(InvalidInput):
        store.commit("s1", HARNESS, manifest_for(HARNESS), "HEAD")
    with pytest.raises(InvalidInput):
        ArtifactManifest(content_id_of({}), None, "lora", {}, {})
    with pytest.raises(InvalidInput):  # metadata that is not JSON
        store.commit("s1", {}, ArtifactManifest(content_id_of({}), None, "empty", {}, {"x": float("nan")}), None)
    assert store.scenario_head("s1") is None
    nested = {"dir/reef-artifact.json": b"fine below the root", ".github/ci.yml": b"fine"}
    assert store.files(commit(store, nested, None)) == nested
    ignored = {".gitignore": b"*.tmp\n", "x.tmp": b"kept anyway"}
    assert store.files(commit(store, ignored, store.scenario_head("s1"))) == ignored


def test_manifest_json_round_trip() -> None:
    source = {"kind": "fork", "release_id": "b" * 40}
    m = ArtifactManifest("sha256:" + "0" * 64, "a" * 40, ArtifactKind.WEIGHTS, source, {})
    assert m.kind == "weights"
    assert ArtifactManifest.from_json(m.to_json()) == m
    with pytest.raises(InvalidInput):
        ArtifactManifest.from_json({"content_id": "sha256:x"})


def test_reset_scenario_head(store: ArtifactStore) -> None:
    first = commit(store, HARNESS, None)
    second = commit(store, {"rules.txt": b"2\n"}, first)
    store.reset_scenario_head("s1", first)
    assert store.scenario_head("s1") == first
    assert store.has_release(second)  # moving the ref loses nothing
    third = commit(store, {"rules.txt": b"3\n"}, first)
    store.reset_scenario_head("s1", None)
    assert store.scenario_head("s1") is None
    assert commit(store, HARNESS, None) not in (first, second, third)
    with pytest.raises(MissingArtifact):
        store.reset_scenario_head("s1", "e" * 40)
    store.reset_scenario_head("ghost", None)  # deleting an absent ref is fine


def test_plain_git_reads_the_repository(store: ArtifactStore, tmp_path: Path) -> None:
    first = commit(store, HARNESS, None)
    second = commit(store, {**HARNESS, "w.pt": b"tensor"}, first)
    ref = REF_PREFIX + scenario_key("s1")
    log = plain_git(store.root, "log", "--format=%H %s", ref).splitlines()
    assert [line.split()[0] for line in log] == [second, first]
    assert "reef: harness release for scenario s1" in log[0]
    assert plain_git(store.root, "for-each-ref", "--format=%(refname)").split() == [ref]
    plain_git(store.root, "fsck", "--strict", "--no-progress")
    # A clone with plain git gets the pointers; the LFS bytes stay beside the repository.
    clone = tmp_path / "clone"
    for args in (
        ["clone", "-q", "--no-checkout", str(store.root), str(clone)],
        ["-C", str(clone), "fetch", "-q", "origin", f"{ref}:refs/heads/main"],
        ["-C", str(clone), "checkout", "-q", "main"],
    ):
        subprocess.run(["git", *args], check=True, capture_output=True, env=PLAIN_ENV)
    assert (clone / "w.pt").read_text().startswith("version https://git-lfs.github.com/spec/v1\n")
    assert (clone / "rules.txt").read_bytes() == HARNESS["rules.txt"]


def test_reopening_an_existing_store(store: ArtifactStore) -> None:
    release = commit(store, HARNESS, None)
    again = ArtifactStore(store.root)
    assert again.scenario_head("s1") == release
    assert again.files(release) == HARNESS
    assert plain_git(store.root, "config", "core.hooksPath").strip() == os.devnull
    assert [p.name for p in store.root.parent.iterdir()] == [store.root.name]  # no init leftovers


def test_creating_in_an_existing_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "state" / "artifacts.git").mkdir(parents=True)
    store = ArtifactStore(tmp_path / "state" / "artifacts.git")
    assert store.files(commit(store, HARNESS, None)) == HARNESS
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("not a repository")
    with pytest.raises(StorageUnavailable):
        ArtifactStore(tmp_path / "junk")


def test_content_diff_names_changed_paths_shows_lfs_pointers_and_leaves_out_the_manifest(store: ArtifactStore) -> None:
    weights = os.urandom(2048)
    first = commit(store, {"adapter_model.safetensors": weights, "harness/rules/a.md": b"Rule A.\n"}, None)
    changed, text = store.content_diff(None, first)
    assert changed == ["adapter_model.safetensors", "harness/rules/a.md"]
    assert f"+oid sha256:{hashlib.sha256(weights).hexdigest()}" in text and "+Rule A." in text
    second = commit(store, {"adapter_model.safetensors": weights, "harness/rules/a.md": b"Rule A, changed.\n"}, first)
    changed, text = store.content_diff(first, second)
    assert changed == ["harness/rules/a.md"] and "-Rule A." in text and "+Rule A, changed." in text
    assert "reef-artifact.json" not in text and ".gitattributes" not in text
    with pytest.raises(MissingArtifact):
        store.content_diff(first, "f" * 40)
