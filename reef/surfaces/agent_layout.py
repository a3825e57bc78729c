"""A harness laid out as one agent reads it, packed as a tar archive for the `reef-agent` wrapper.

The wrapper writes into the project it runs in (its working directory), not the user's home:
a scenario's harness belongs to one workload, and user-level files would also steer every other
session of the same agent, with or without Reef. Nothing user-authored is replaced:

- the system prompt, the rules and a catalogue of the skills go into `reef-block.md`, which the
  wrapper puts between marker lines in the agent's memory file (`CLAUDE.md` or `AGENTS.md`),
  replacing only that block;
- each skill becomes `<skills dir>/reef-<name>/SKILL.md` (a Reef-owned name; the front matter's
  `name` matches the folder, as opencode and pi require);
- extensions go to `.reef-agent/extensions/`, installed and never executed.

Every path in the archive is plain ASCII (`[A-Za-z0-9._/-]`), relative, without `..`, and inside
the folders the adapter allows; the wrapper checks all of it again before it writes anything,
and refuses to write through a symbolic link that resolves outside the project.
"""

from __future__ import annotations

import io
import json
import logging
import re
import tarfile
from dataclasses import dataclass

from reef.core.errors import InvalidInput
from reef.surfaces.harness import HarnessTree

log = logging.getLogger(__name__)

BLOCK_FILE = "reef-block.md"
EXTENSIONS_DIR = ".reef-agent/extensions"
BLOCK_BEGIN = "<!-- reef:harness:begin (written by reef-agent; this block is replaced on every run) -->"
BLOCK_END = "<!-- reef:harness:end -->"
_SAFE_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Adapter:
    """Where one agent reads its instructions and skills, and how it is started."""

    name: str
    memory_file: str  # the file that holds Reef's marker block, relative to the project
    skills_dir: str  # the project-level skills folder the agent scans
    command: str  # the agent's executable; empty: the user names it (generic)


# Documented project-level locations: Claude Code reads ./CLAUDE.md and .claude/skills/<name>/SKILL.md;
# opencode reads ./AGENTS.md and .opencode/skills/<name>/SKILL.md; pi reads ./AGENTS.md and
# .pi/skills/; Codex CLI reads ./AGENTS.md and .agents/skills/, the cross-agent (Agent Skills)
# folder, which the generic adapter uses for anything else.
ADAPTERS: dict[str, Adapter] = {
    "claude": Adapter("claude", "CLAUDE.md", ".claude/skills", "claude"),
    "opencode": Adapter("opencode", "AGENTS.md", ".opencode/skills", "opencode"),
    "pi": Adapter("pi", "AGENTS.md", ".pi/skills", "pi"),
    "codex": Adapter("codex", "AGENTS.md", ".agents/skills", "codex"),
    "generic": Adapter("generic", "AGENTS.md", ".agents/skills", ""),
}


def adapter_named(name: str | None) -> Adapter:
    adapter = ADAPTERS.get(name or "")
    if adapter is None:
        raise InvalidInput(f"adapter must be one of {', '.join(ADAPTERS)}, got {name!r}")
    return adapter


def skill_folder(name: str, taken: set[str]) -> str:
    """`reef-<name>` in the Agent Skills name rule (lower-case words joined by single hyphens)."""
    words = [w for w in re.split(r"[-_]+", name) if w]
    base = "-".join(["reef", *words])[:60].rstrip("-")
    folder, n = base, 2
    while folder in taken:
        folder, n = f"{base}-{n}", n + 1
    taken.add(folder)
    return folder


def render_block(tree: HarnessTree, scenario: str, release_id: str, folders: dict[str, str], adapter: Adapter) -> str:
    """The text between Reef's marker lines: system prompt, rules, where the skills are."""
    parts = [f"# Reef harness (scenario {scenario}, release {release_id})"]
    if tree.system.strip():
        parts.append(tree.system.strip())
    if tree.rules:
        parts.append("## Rules\n\n" + "\n\n".join(f"### {n}\n{t.strip()}" for n, t in sorted(tree.rules.items())))
    if tree.skills:
        lines = [
            f"- {folders[n]} ({adapter.skills_dir}/{folders[n]}/SKILL.md): {s.description}"
            for n, s in sorted(tree.skills.items())
        ]
        parts.append("## Skills\n\n" + "\n".join(lines))
    text = "\n\n".join(parts)
    # A marker line inside the text would cut the block short on the next run.
    kept = [line for line in text.split("\n") if line.strip() not in (BLOCK_BEGIN, BLOCK_END)]
    return "\n".join(kept) + "\n"


def render_skill(folder: str, description: str, body: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar: quotes, colons and '#' stay text.
    return f"---\nname: {folder}\ndescription: {json.dumps(description, ensure_ascii=False)}\n---\n{body}"


def layout(tree: HarnessTree, adapter: Adapter, scenario: str, release_id: str) -> dict[str, bytes]:
    """The files the wrapper writes for `adapter`, keyed by their path in the project."""
    taken: set[str] = set()
    folders = {name: skill_folder(name, taken) for name in sorted(tree.skills)}
    files = {BLOCK_FILE: render_block(tree, scenario, release_id, folders, adapter).encode()}
    for name, skill in sorted(tree.skills.items()):
        files[f"{adapter.skills_dir}/{folders[name]}/SKILL.md"] = render_skill(
            folders[name], skill.description, skill.body
        ).encode()
    for path, data in sorted(tree.extensions.items()):
        if all(_SAFE_PART.fullmatch(part) for part in path.split("/")):
            files[f"{EXTENSIONS_DIR}/{path}"] = bytes(data)
        else:
            log.warning("extension %r is not sent to agent wrappers: its path is not plain ASCII", path)
    return files


def inject_note(scenario: str, release_id: str) -> dict[str, bytes]:
    """What the wrapper installs for a scenario in inject mode: no rules or skills, a note."""
    note = (
        f"# Reef harness (scenario {scenario}, release {release_id})\n\n"
        "Reef adds this scenario's harness to every request itself (inject mode); "
        "nothing is installed here.\n"
    )
    return {BLOCK_FILE: note.encode()}


def pack_tar(files: dict[str, bytes]) -> bytes:
    """Regular files only (no folders, links or devices), fixed owner, mode and time."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()
