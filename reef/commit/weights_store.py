"""Weights in the artifact store: what a release carries ("lora", "full" or None), what the store
keeps for a scenario's releases (weights, optimiser state, and the bytes content addressing
shares between releases), and the compaction of old releases' optimiser state.

A full-weight release is a Hugging Face checkpoint, one safetensors shard per layer: every shard
is an LFS object named by its sha256 (reef/commit/artifacts.py), so a layer whose bytes did not
change between releases is kept once, however many releases name it. The optimiser state beside
the weights (`training/`) is only needed to go on training from a release; compaction frees it
for every release but the newest `keep` (the head among them), leaving a marker so the release
still reads, and serves, without it. A release's weights are never compacted: a rollback to any
release is served.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from reef.commit.artifacts import ArtifactStore
from reef.core.training import TRAINING_FOLDER, weights_kind

_KINDS: dict[tuple[str, str], str | None] = {}  # (store root, release id) -> weights kind: content never changes


def release_weights(store: ArtifactStore, release_id: str) -> str | None:
    """ "lora", "full" or None (the base model's) for a release, from its file names alone."""
    key = (str(store.root), release_id)
    if key not in _KINDS:
        paths, _ = store.lfs_pointers(release_id)
        _KINDS[key] = weights_kind(dict.fromkeys(paths, b""))
    return _KINDS[key]


@dataclass(frozen=True)
class SizeReport:
    releases: int
    weights_bytes: int  # LFS objects of weights (adapters, shards) kept, each once
    optimiser_bytes: int  # LFS objects of optimiser state (`training/`) kept, each once
    shared_bytes: int  # bytes the releases name more than once, kept once (not copied per release)
    compacted_bytes: int = 0  # optimiser state the releases name that compaction freed

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def size_report(store: ArtifactStore, release_ids: Sequence[str]) -> SizeReport:
    """What the store keeps for these releases' LFS objects (the small files are git blobs, which
    git keeps once as well)."""
    sizes: dict[str, tuple[int, bool]] = {}  # oid -> (size, is optimiser state)
    named = compacted = 0
    for release_id in release_ids:
        _, pointers = store.lfs_pointers(release_id)
        for path, (oid, size) in pointers.items():
            if store.compacted(path, oid):
                compacted += size
                continue
            named += size
            sizes[oid] = (size, path.startswith(TRAINING_FOLDER))
    kept = sum(size for size, _ in sizes.values())
    optimiser = sum(size for size, is_optimiser in sizes.values() if is_optimiser)
    return SizeReport(len(release_ids), kept - optimiser, optimiser, named - kept, compacted)


@dataclass(frozen=True)
class Compaction:
    objects: int
    freed_bytes: int


def compact_optimiser(store: ArtifactStore, release_ids: Sequence[str], keep: int = 2) -> Compaction:
    """Free the optimiser state of every release but the last `keep` of `release_ids` (oldest
    first, so the head is last; `keep` is at least 1). An object that any kept release, or any
    release's weights, names stays. The caller holds the scenario's commit log, so no release is
    published meanwhile. With a remote, the remote keeps its copy (only this clone's bytes go)."""
    keep = max(1, keep)
    needed: set[str] = set()
    candidates: dict[str, int] = {}
    for index, release_id in enumerate(release_ids):
        _, pointers = store.lfs_pointers(release_id)
        kept = index >= len(release_ids) - keep
        for path, (oid, size) in pointers.items():
            if kept or not path.startswith(TRAINING_FOLDER):
                needed.add(oid)
            else:
                candidates[oid] = size
    objects = freed = 0
    marks = store.root / "lfs" / "compacted"
    marks.mkdir(parents=True, exist_ok=True)
    for oid, size in sorted(candidates.items()):
        obj = store.lfs_path(oid)
        if oid in needed or not obj.is_file():
            continue
        (marks / oid).touch()  # first: a crash between the two leaves a release that reads the same
        os.unlink(obj)
        objects, freed = objects + 1, freed + size
    return Compaction(objects, freed)
