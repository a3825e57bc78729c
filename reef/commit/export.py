"""A release's content as plain files other tools load: its LoRA adapter as a PEFT folder, its
harness as a tree of text files.

    DIR/adapter_config.json          peft's config; `base_model_name_or_path` names the base model
    DIR/adapter_model.safetensors    the LoRA weights (`PeftModel.from_pretrained(base, DIR)`, vLLM's
                                     `LoRARequest(name, id, DIR)`)
    DIR/harness/system.md, rules/, skills/<name>/SKILL.md, ...   the harness (docs/harness.md)
    DIR/reef-export.json             where it came from: scenario, release, content id, base model

`base_model_name_or_path` is, in order: the caller's `base_model`; the Hugging Face name of
SmolLM2-135M-Instruct when the adapter was trained on Reef's embedded model (its stored value
is then the local converted folder, `.../smollm2-135m-instruct-fp32`, which `reef-export.json`
keeps as `trained_on`); otherwise what the trainer stored.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping

from reef.commit.state import ReefState
from reef.core.errors import InvalidInput, NotFound
from reef.core.types import Release
from reef.observe.export import refuse_link_or_special
from reef.runtimes.model_files import MODEL_DIRNAME
from reef.surfaces.harness import PREFIX as HARNESS_PREFIX
from reef.surfaces.harness import HarnessTree

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
EMBEDDED_BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROVENANCE = "reef-export.json"
PARTS = ("adapter", "harness")


@dataclass(frozen=True)
class ExportedRelease:
    release: Release
    dest: Path
    adapter_files: list[str] = field(default_factory=list)
    harness_files: list[str] = field(default_factory=list)
    base_model: str | None = None


def resolve_release(state: ReefState, scenario: str, release_id: str) -> Release:
    """A release of the scenario's chain by its id or an unambiguous prefix (at least 4 characters).
    `NotFound` for an unknown scenario or release."""
    chain = state.chain(scenario)
    releases = chain.releases()
    exact = [r for r in releases if r.release_id == release_id]
    if exact:
        return exact[0]
    matches = [r for r in releases if len(release_id) >= 4 and r.release_id.startswith(release_id)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise InvalidInput(
            f"release prefix {release_id!r} is ambiguous in scenario {scenario!r}: "
            + ", ".join(r.release_id for r in matches[:5])
        )
    recent = ", ".join(f"{r.release_id[:12]} (step {r.step})" for r in releases[:5])
    raise NotFound(f"scenario {scenario!r} has no release {release_id!r}; its newest: {recent}")


def split_content(files: Mapping[str, bytes]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(the adapter's files by name, the harness's files with the `harness/` prefix). The adapter is
    the folder of the first `adapter_config.json` outside the harness, as the runtime finds it."""
    harness = {p: d for p, d in files.items() if p.startswith(HARNESS_PREFIX)}
    config = next(
        (p for p in sorted(files) if p.rsplit("/", 1)[-1] == ADAPTER_CONFIG and not p.startswith(HARNESS_PREFIX)), None
    )
    if config is None:
        return {}, harness
    folder = config[: -len(ADAPTER_CONFIG)]
    adapter = {
        p[len(folder) :]: d
        for p, d in files.items()
        if p.startswith(folder) and "/" not in p[len(folder) :] and not p.startswith(HARNESS_PREFIX)
    }
    return adapter, harness


def export_release(
    state: ReefState,
    scenario: str,
    release_id: str,
    dest: Path | str,
    *,
    force: bool = False,
    base_model: str | None = None,
    parts: Collection[str] = PARTS,
) -> ExportedRelease:
    """Write a release's adapter (PEFT folder) and/or harness into `dest`. A `dest` that exists
    and is not empty is refused unless `force` (then our files are overwritten, the harness
    folder pruned of harness files the release lacks, and anything else left alone)."""
    dest = Path(dest)
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise InvalidInput(f"parts must be among {', '.join(PARTS)}, got {sorted(parts)}")
    refuse_link_or_special(dest, "a directory")  # a link is never written through nor replaced
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise InvalidInput(f"{dest} is not empty (use --force to write into it)")
    release = resolve_release(state, scenario, release_id)
    adapter, harness = split_content(state.artifacts.files(release.release_id))
    wanted_adapter = adapter if "adapter" in parts else {}
    wanted_harness = harness if "harness" in parts else {}
    if not wanted_adapter and not wanted_harness:
        held = " and ".join(n for n, f in (("an adapter", adapter), ("a harness", harness)) if f) or "nothing"
        raise InvalidInput(
            f"release {release.release_id} of scenario {scenario!r} holds {held}; "
            f"asked for {' and '.join(parts)}: nothing to export"
        )
    config = _adapter_config(wanted_adapter, release.release_id) if wanted_adapter else None
    trained_on = config.get("base_model_name_or_path") if config else None
    if config is not None:
        config["base_model_name_or_path"] = base_model or _portable_base(trained_on)
        wanted_adapter = {
            **wanted_adapter,
            ADAPTER_CONFIG: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
        }
    tree = _harness_tree(wanted_harness, release.release_id) if wanted_harness else None
    provenance = {
        "scenario": scenario,
        "release_id": release.release_id,
        "content_id": release.content_id,
        "step": release.step,
        "operation": release.operation.value,
        "base_model_name_or_path": config["base_model_name_or_path"] if config else None,
        "trained_on": trained_on,
        "adapter": sorted(wanted_adapter),
        "harness": sorted(wanted_harness),
    }

    def write(root: Path) -> None:
        for name, data in wanted_adapter.items():
            _write_file(root / name, data)
        if tree is not None:
            tree.write_dir(root / "harness", prune=True)
        _write_file(root / PROVENANCE, (json.dumps(provenance, indent=2, sort_keys=True) + "\n").encode())

    if dest.exists():
        write(dest)
    else:  # all or nothing: built beside, then renamed into place
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            write(tmp)
            tmp.chmod(0o755)
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return ExportedRelease(
        release,
        dest,
        sorted(wanted_adapter),
        sorted(wanted_harness),
        config["base_model_name_or_path"] if config else None,
    )


def _adapter_config(adapter: Mapping[str, bytes], release_id: str) -> dict[str, Any]:
    if ADAPTER_WEIGHTS not in adapter:
        raise InvalidInput(
            f"release {release_id}: the adapter has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS} "
            f"(files: {', '.join(sorted(adapter))})"
        )
    try:
        config = json.loads(adapter[ADAPTER_CONFIG])
    except ValueError as exc:
        raise InvalidInput(f"release {release_id}: {ADAPTER_CONFIG} is not JSON: {exc}") from None
    if not isinstance(config, dict) or not config.get("peft_type"):
        raise InvalidInput(f"release {release_id}: {ADAPTER_CONFIG} is not a peft config (no peft_type)")
    return config


def _portable_base(stored: Any) -> Any:
    """The embedded model's converted folder is a path on the training machine; its name on the
    Hugging Face hub is what another machine (vLLM, transformers) can load."""
    if isinstance(stored, str) and Path(stored).name == MODEL_DIRNAME:
        return EMBEDDED_BASE_MODEL
    return stored


def _harness_tree(files: Mapping[str, bytes], release_id: str) -> HarnessTree:
    try:
        return HarnessTree.from_files(files)
    except InvalidInput as exc:
        raise InvalidInput(f"release {release_id}: its harness does not parse: {exc}") from None


def _write_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a new file beside it (created, so a link planted there is never
    followed) renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
