"""The harness surface: an agent's system prompt, rules and skills as a tree of text files.

In a release's content the harness lives under `harness/`, beside any weights at the root:

    harness/system.md                 the system prompt
    harness/rules/<name>.md           one rule each
    harness/skills/<name>/SKILL.md    front matter (`name`, `description` between `---` lines), then the body
    harness/config.json               a JSON object (for the agent wrapper; Reef only stores it)
    harness/extensions/...            files the wrapper installs beside the agent; never executed by Reef

Names are `[a-z0-9][a-z0-9-_]{0,63}`. Anything else under `harness/` is an error, so a typo in
a seed directory is caught when it is read, not silently dropped. `HarnessTree` is the parsed,
validated form; `to_files()` is its one canonical serialisation, so equal trees have equal
`content_id`s and a `git diff` of two releases shows exactly the text that changed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from reef.core.canonical import content_id_of
from reef.core.errors import InvalidInput
from reef.core.types import ArtifactKind

PREFIX = "harness/"
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9\-_]{0,63}$")
MAX_TEXT_CHARS = 64_000  # one system prompt, rule or skill body; keeps injected prompts bounded
MAX_DESCRIPTION_CHARS = 1_024

MutationOp = Literal["create", "update", "remove"]
MutationKind = Literal["rule", "skill", "system"]
_OPS = ("create", "update", "remove")
_KINDS = ("rule", "skill", "system")


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    body: str

    def __post_init__(self) -> None:
        check_name(self.name, "skill name")
        if not isinstance(self.description, str) or not self.description.strip():
            raise InvalidInput(f"skill {self.name!r} needs a non-empty description")
        # One line in the catalogue: runs of whitespace (a folded YAML description) become one space.
        object.__setattr__(self, "description", " ".join(self.description.split()))
        _check_text(self.description, f"description of skill {self.name!r}", MAX_DESCRIPTION_CHARS)
        _check_text(self.body, f"body of skill {self.name!r}")

    def to_markdown(self) -> str:
        front = yaml.safe_dump(
            {"name": self.name, "description": self.description}, sort_keys=False, allow_unicode=True, width=1 << 20
        )
        return f"---\n{front}---\n{self.body}"

    @classmethod
    def from_markdown(cls, text: str, where: str) -> Skill:
        lines = text.split("\n")
        if not lines or lines[0].strip() != "---":
            raise InvalidInput(f"{where}: must start with a '---' line, then name and description, then '---'")
        try:
            end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
        except StopIteration:
            raise InvalidInput(f"{where}: the front matter has no closing '---' line") from None
        try:
            front = yaml.safe_load("\n".join(lines[1:end])) or {}
        except yaml.YAMLError as exc:
            raise InvalidInput(f"{where}: front matter is not valid YAML: {exc}") from None
        if (
            not isinstance(front, dict)
            or not isinstance(front.get("name"), str)
            or not isinstance(front.get("description"), str)
        ):
            raise InvalidInput(f"{where}: front matter needs text fields name and description")
        return cls(front["name"], front["description"], "\n".join(lines[end + 1 :]))


@dataclass(frozen=True)
class HarnessTree:
    """A validated harness. Treat its dicts as read-only: derive new trees with `apply`."""

    system: str = ""
    rules: dict[str, str] = field(default_factory=dict)
    skills: dict[str, Skill] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    extensions: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_text(self.system, "system prompt")
        for name, text in self.rules.items():
            check_name(name, "rule name")
            _check_text(text, f"rule {name!r}")
        for name, skill in self.skills.items():
            if not isinstance(skill, Skill) or skill.name != name:
                raise InvalidInput(f"skill {name!r} must be a Skill named {name!r}")
        if not isinstance(self.config, dict):
            raise InvalidInput("harness config must be a JSON object")
        for path, data in self.extensions.items():
            _check_extension_path(path)
            if not isinstance(data, (bytes, bytearray)):
                raise InvalidInput(f"extension {path!r} must be bytes")

    # -- files -------------------------------------------------------------------------------

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> HarnessTree:
        """The harness in an artifact's files (only `harness/*` paths are read)."""
        system = ""
        rules: dict[str, str] = {}
        skills: dict[str, Skill] = {}
        config: dict[str, Any] = {}
        extensions: dict[str, bytes] = {}
        for path in sorted(files):
            if not path.startswith(PREFIX):
                continue
            rel, data = path[len(PREFIX) :], files[path]
            parts = rel.split("/")
            if rel == "system.md":
                system = _decode(data, path)
            elif rel == "config.json":
                config = _parse_config(data, path)
            elif parts[0] == "rules" and len(parts) == 2 and parts[1].endswith(".md"):
                rules[check_name(parts[1][:-3], f"{path}: rule name")] = _decode(data, path)
            elif parts[0] == "skills" and len(parts) == 3 and parts[2] == "SKILL.md":
                skill = Skill.from_markdown(_decode(data, path), path)
                if skill.name != check_name(parts[1], f"{path}: skill folder"):
                    raise InvalidInput(f"{path}: front matter names {skill.name!r}, the folder {parts[1]!r}")
                skills[skill.name] = skill
            elif parts[0] == "extensions" and len(parts) > 1:
                extensions[_check_extension_path("/".join(parts[1:]))] = bytes(data)
            else:
                raise InvalidInput(
                    f"{path}: not a harness file (system.md, config.json, rules/<name>.md, "
                    "skills/<name>/SKILL.md or extensions/...)"
                )
        return cls(system, rules, skills, config, extensions)

    def to_files(self) -> dict[str, bytes]:
        """The canonical files, with the `harness/` prefix; an empty tree has none."""
        files: dict[str, bytes] = {}
        if self.system:
            files[PREFIX + "system.md"] = self.system.encode()
        if self.config:
            files[PREFIX + "config.json"] = (json.dumps(self.config, indent=2, sort_keys=True) + "\n").encode()
        for name, text in self.rules.items():
            files[f"{PREFIX}rules/{name}.md"] = text.encode()
        for name, skill in self.skills.items():
            files[f"{PREFIX}skills/{name}/SKILL.md"] = skill.to_markdown().encode()
        for path, data in self.extensions.items():
            files[f"{PREFIX}extensions/{path}"] = bytes(data)
        return dict(sorted(files.items()))

    @classmethod
    def from_dir(cls, path: Path | str) -> HarnessTree:
        """A plain directory laid out like `harness/` (without the prefix). Hidden files and
        folders (`.git`, `.DS_Store`) are skipped; symbolic links are refused."""
        root = Path(path)
        if not root.is_dir():
            raise InvalidInput(f"harness directory {root} does not exist or is not a directory")
        files: dict[str, bytes] = {}
        for item in sorted(root.rglob("*")):
            rel = item.relative_to(root)
            if any(part.startswith(".") for part in rel.parts):
                continue
            if item.is_symlink():
                raise InvalidInput(f"{item}: symbolic links are not read into a harness")
            if item.is_file():
                files[PREFIX + rel.as_posix()] = item.read_bytes()
        return cls.from_files(files)

    def write_dir(self, path: Path | str, prune: bool = False) -> Path:
        """Write the tree into a plain directory (without the prefix). Other files there stay,
        unless `prune`: then files in the harness layout that the tree lacks (a removed rule) go."""
        root = Path(path)
        wanted = {name[len(PREFIX) :]: data for name, data in self.to_files().items()}
        if prune and root.is_dir():
            _prune(root, set(wanted))
        for rel, data in wanted.items():
            target = root.joinpath(*rel.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        root.mkdir(parents=True, exist_ok=True)
        return root

    # -- identity ------------------------------------------------------------------------------

    @cached_property
    def content_id(self) -> str:
        return content_id_of(self.to_files())

    @property
    def is_empty(self) -> bool:
        return not (self.system or self.rules or self.skills or self.config or self.extensions)

    # -- changes -------------------------------------------------------------------------------

    def apply(self, mutations: Sequence[Mutation]) -> HarnessTree:
        """A new tree with the mutations applied in order; `InvalidInput` when one does not fit."""
        system, rules, skills = self.system, dict(self.rules), dict(self.skills)
        for m in mutations:
            if m.kind == "system":
                _check_fit(m, bool(system), "the system prompt")
                system = m.body if m.op != "remove" else ""
            elif m.kind == "rule":
                _check_fit(m, m.name in rules, f"rule {m.name!r}")
                if m.op == "remove":
                    del rules[m.name]
                else:
                    rules[m.name] = m.body
            else:
                _check_fit(m, m.name in skills, f"skill {m.name!r}")
                if m.op == "remove":
                    del skills[m.name]
                else:
                    old = skills.get(m.name)
                    description = m.description or (old.description if old else "")
                    skills[m.name] = Skill(m.name, description, m.body)
        return HarnessTree(
            system, dict(sorted(rules.items())), dict(sorted(skills.items())), self.config, self.extensions
        )

    # -- rendering (cached per tree object; inject mode keeps trees by content id) ----------------

    @cached_property
    def _rendering(self) -> _Rendering:
        return _Rendering.of(self)


@dataclass(frozen=True)
class Mutation:
    """One change a proposer asks for. `update` of a skill with an empty description keeps the
    old description; `body` is the whole new text (not a patch). For `system` the name is
    always `system`."""

    op: MutationOp
    kind: MutationKind
    name: str
    body: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise InvalidInput(f"mutation op must be one of {', '.join(_OPS)}, got {self.op!r}")
        if self.kind not in _KINDS:
            raise InvalidInput(f"mutation kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.kind == "system":
            object.__setattr__(self, "name", "system")
        else:
            check_name(self.name, f"{self.kind} name")
        _check_text(self.body, "mutation body")
        _check_text(self.description, "mutation description", MAX_DESCRIPTION_CHARS)
        if self.op != "remove" and not self.body.strip():
            raise InvalidInput(f"{self.op} of {self.kind} {self.name!r} needs a non-empty body")
        if self.op == "create" and self.kind == "skill" and not self.description.strip():
            raise InvalidInput(f"create of skill {self.name!r} needs a description")
        if self.description and self.kind != "skill":
            raise InvalidInput(f"only skills have a description, not a {self.kind}")

    def to_json(self) -> dict[str, str]:
        data = {"op": self.op, "kind": self.kind, "name": self.name}
        if self.body:
            data["body"] = self.body
        if self.description:
            data["description"] = self.description
        return data

    @classmethod
    def from_json(cls, obj: object) -> Mutation:
        if not isinstance(obj, dict):
            raise InvalidInput(f"a mutation must be a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - {"op", "kind", "name", "body", "description"})
        if unknown:
            raise InvalidInput(f"unknown mutation field(s): {', '.join(unknown)}")
        for key in ("op", "kind", "name", "body", "description"):
            if key in obj and not isinstance(obj[key], str):
                raise InvalidInput(f"mutation field {key!r} must be text")
        if "op" not in obj or "kind" not in obj:
            raise InvalidInput("a mutation needs op and kind")
        if obj["kind"] != "system" and "name" not in obj:
            raise InvalidInput(f"a {obj['kind']} mutation needs a name")
        return cls(obj["op"], obj["kind"], obj.get("name", "system"), obj.get("body", ""), obj.get("description", ""))


# -- rendering ---------------------------------------------------------------------------------

SKILLS_HEADING = "# Skills"
NEEDS_RULE = (
    "A skill's full instructions follow below when the conversation mentions its name "
    "(case-insensitive; '-' and '_' may also be written as spaces)."
)


@dataclass(frozen=True)
class _Mention:
    """Finds a skill's name in lower-cased text: a cheap substring test first (most requests
    mention no skill), the word-boundary pattern only when it passes."""

    name: str
    key: str  # the longest word of the name
    pattern: re.Pattern[str]

    @classmethod
    def of(cls, name: str) -> _Mention:
        words = [w for w in re.split(r"[-_]", name) if w]
        body = r"[-_ ]".join(re.escape(w) for w in words)
        return cls(name, max(words, key=len), re.compile(body))  # a literal start: re's fast scan

    def found_in(self, lowered: str) -> bool:
        if self.key not in lowered:
            return False
        for match in self.pattern.finditer(lowered):  # whole words only; checked by hand, since a
            start, end = match.span()  # leading look-behind would slow re to a crawl
            if not (start and _is_word_char(lowered[start - 1])) and not (
                end < len(lowered) and _is_word_char(lowered[end])
            ):
                return True
        return False


def _is_word_char(char: str) -> bool:
    return "a" <= char <= "z" or "0" <= char <= "9"


@dataclass(frozen=True)
class _Rendering:
    """What every request of one tree shares: the fixed text and one matcher per skill."""

    head: str  # system prompt, rules, skill catalogue
    mentions: tuple[_Mention, ...]
    sections: Mapping[str, str]

    @classmethod
    def of(cls, tree: HarnessTree) -> _Rendering:
        parts: list[str] = []
        if tree.system.strip():
            parts.append(tree.system.strip())
        if tree.rules:
            parts.append("# Rules\n\n" + "\n\n".join(f"## {n}\n{t.strip()}" for n, t in sorted(tree.rules.items())))
        if tree.skills:
            catalogue = "\n".join(f"- {s.name}: {s.description.strip()}" for _, s in sorted(tree.skills.items()))
            parts.append(f"{SKILLS_HEADING}\n\n{NEEDS_RULE}\n\n{catalogue}")
        mentions = tuple(_Mention.of(name) for name in sorted(tree.skills))
        sections = {name: f"## Skill: {name}\n{s.body.strip()}" for name, s in tree.skills.items()}
        return cls("\n\n".join(parts), mentions, sections)

    def render(self, request_text: str) -> tuple[str, list[str]]:
        needed = self.needed(request_text)
        text = "\n\n".join([self.head, *(self.sections[n] for n in needed)]) if needed else self.head
        return text, needed

    def needed(self, request_text: str) -> list[str]:
        if not self.mentions:
            return []
        lowered = request_text.lower()
        return [m.name for m in self.mentions if m.found_in(lowered)]


def skills_needed(tree: HarnessTree, request_text: str) -> list[str]:
    """The skills whose full body `render_system` includes for this text (sorted by name)."""
    return tree._rendering.needed(request_text)  # noqa: SLF001


def render_system(tree: HarnessTree, request_text: str) -> str:
    """The text inject mode adds to a request's system prompt: the system prompt, the rules,
    the skill catalogue (name: description) and the full body of each skill `request_text`
    mentions by name. Empty for an empty tree."""
    return render_with_skills(tree, request_text)[0]


def render_with_skills(tree: HarnessTree, request_text: str) -> tuple[str, list[str]]:
    """`render_system` and the names of the skills whose body it included, in one pass.

    The whole conversation is matched, not only its last turn: a conversation only grows, so
    once a skill is mentioned its body stays in every later turn's prompt (a stable prefix,
    which provider prompt caches rely on)."""
    if tree.is_empty:
        return "", []
    return tree._rendering.render(request_text)  # noqa: SLF001


# -- artifacts ---------------------------------------------------------------------------------


def merge_files(weights_and_other: Mapping[str, bytes], tree: HarnessTree) -> dict[str, bytes]:
    """The files of a release whose harness is replaced by `tree`; every other file is kept."""
    kept = {p: d for p, d in weights_and_other.items() if not p.startswith(PREFIX)}
    return {**kept, **tree.to_files()}


def artifact_kind(files: Mapping[str, bytes]) -> ArtifactKind:
    """What a release's files hold: weights (files outside `harness/`), a harness, both, or nothing."""
    harness = any(p.startswith(PREFIX) for p in files)
    other = any(not p.startswith(PREFIX) for p in files)
    if harness and other:
        return ArtifactKind.BOTH
    return ArtifactKind.HARNESS if harness else ArtifactKind.WEIGHTS if other else ArtifactKind.EMPTY


def _prune(root: Path, keep: set[str]) -> None:
    for folder in ("rules", "skills", "extensions"):
        base = root / folder
        if not base.is_dir() or base.is_symlink():
            continue
        for item in sorted(base.rglob("*"), reverse=True):  # children before their folders
            rel = item.relative_to(root).as_posix()
            if any(part.startswith(".") for part in item.relative_to(root).parts):
                continue  # hidden files are not the harness's (from_dir skips them too)
            if item.is_symlink() or item.is_file():
                if rel not in keep:
                    item.unlink()
            elif item.is_dir() and not any(item.iterdir()):
                item.rmdir()
    for name in ("system.md", "config.json"):
        if name not in keep and (root / name).is_file():
            (root / name).unlink()


# -- validation --------------------------------------------------------------------------------


def check_name(name: object, what: str = "name") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidInput(f"{what} must match [a-z0-9][a-z0-9-_]{{0,63}}, got {name!r}")
    return name


def _check_text(text: object, what: str, limit: int = MAX_TEXT_CHARS) -> None:
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be text")
    if len(text) > limit:
        raise InvalidInput(f"{what} is {len(text)} characters; the limit is {limit}")
    if "\0" in text:
        raise InvalidInput(f"{what} must not contain NUL characters")


def _check_extension_path(path: str) -> str:
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or "\\" in path or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise InvalidInput(f"extension path must be a relative POSIX path, got {path!r}")
    return path


def _check_fit(m: Mutation, exists: bool, what: str) -> None:
    if m.op == "create" and exists:
        raise InvalidInput(f"cannot create {what}: it exists (update it instead)")
    if m.op != "create" and not exists:
        raise InvalidInput(f"cannot {m.op} {what}: it does not exist")


def _decode(data: bytes, path: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not UTF-8 text") from None


def _parse_config(data: bytes, path: str) -> dict[str, Any]:
    try:
        value = json.loads(_decode(data, path))
    except ValueError as exc:
        raise InvalidInput(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{path}: must be a JSON object")
    return value
