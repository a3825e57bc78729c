"""The harness tree: files <-> tree <-> directory, ids, validation, mutations, rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.core.errors import InvalidInput
from reef.core.types import ArtifactKind
from reef.surfaces.harness import (
    HarnessTree,
    Mutation,
    Skill,
    artifact_kind,
    merge_files,
    render_system,
    skills_needed,
)

SKILL_MD = b"""---
name: empty-token
description: How to handle an empty token
---
Check for the empty string before parsing.
"""


def sample_files() -> dict[str, bytes]:
    return {
        "harness/system.md": b"You are a careful coding agent.\n",
        "harness/rules/tests-first.md": b"Write the test before the fix.\n",
        "harness/rules/be-brief.md": b"Answer in one paragraph.\n",
        "harness/skills/empty-token/SKILL.md": SKILL_MD,
        "harness/config.json": b'{"agent": "claude"}',
        "harness/extensions/hooks/pre.sh": b"#!/bin/sh\necho hi\n",
        "adapter_config.json": b"{}",
    }


def test_files_tree_files_round_trip_keeps_every_harness_file_and_drops_the_rest() -> None:
    tree = HarnessTree.from_files(sample_files())
    assert tree.system == "You are a careful coding agent.\n"
    assert tree.rules == {"be-brief": "Answer in one paragraph.\n", "tests-first": "Write the test before the fix.\n"}
    assert tree.skills["empty-token"] == Skill(
        "empty-token", "How to handle an empty token", "Check for the empty string before parsing.\n"
    )
    assert tree.config == {"agent": "claude"}
    assert tree.extensions == {"hooks/pre.sh": b"#!/bin/sh\necho hi\n"}
    files = tree.to_files()
    assert "adapter_config.json" not in files and all(p.startswith("harness/") for p in files)
    assert HarnessTree.from_files(files) == tree
    assert HarnessTree.from_files(files).to_files() == files  # the serialisation is canonical
    assert files["harness/skills/empty-token/SKILL.md"] == SKILL_MD


def test_directory_round_trip_skips_hidden_files(tmp_path: Path) -> None:
    tree = HarnessTree.from_files(sample_files())
    out = tree.write_dir(tmp_path / "h")
    assert (out / "rules" / "be-brief.md").read_text() == "Answer in one paragraph.\n"
    assert (out / "skills" / "empty-token" / "SKILL.md").is_file()
    (out / ".DS_Store").write_bytes(b"\0junk")
    (out / ".git").mkdir()
    (out / ".git" / "HEAD").write_text("ref")
    assert HarnessTree.from_dir(out) == tree


def test_content_id_is_stable_and_changes_with_content() -> None:
    a = HarnessTree.from_files(sample_files())
    b = HarnessTree.from_files(dict(reversed(list(sample_files().items()))))
    assert a.content_id == b.content_id and a.content_id.startswith("sha256:")
    changed = a.apply([Mutation("update", "rule", "be-brief", body="Answer in two paragraphs.\n")])
    assert changed.content_id != a.content_id
    assert HarnessTree().content_id == HarnessTree.from_files({}).content_id
    assert HarnessTree().is_empty and not a.is_empty and HarnessTree().to_files() == {}


@pytest.mark.parametrize(
    "files, message",
    [
        ({"harness/notes.txt": b"x"}, "not a harness file"),
        ({"harness/rules/Bad Name.md": b"x"}, "rule name"),
        ({"harness/rules/nested/x.md": b"x"}, "not a harness file"),
        ({"harness/skills/a/other.md": b"x"}, "not a harness file"),
        ({"harness/skills/a/SKILL.md": b"no front matter"}, "must start with"),
        ({"harness/skills/a/SKILL.md": b"---\nname: a\ndescription: d\n"}, "no closing"),
        ({"harness/skills/a/SKILL.md": b"---\nname: b\ndescription: d\n---\nbody"}, "folder"),
        ({"harness/skills/a/SKILL.md": b"---\nname: a\n---\nbody"}, "name and description"),
        ({"harness/skills/a/SKILL.md": b"---\nname: a\ndescription: '   '\n---\nbody"}, "non-empty description"),
        ({"harness/skills/a/SKILL.md": b"---\nname: [a\n---\n"}, "not valid YAML"),
        ({"harness/config.json": b"[1]"}, "JSON object"),
        ({"harness/config.json": b"{"}, "not valid JSON"),
        ({"harness/system.md": b"\xff\xfe"}, "UTF-8"),
        ({"harness/rules/r.md": "x".encode() * 70_000}, "limit"),
    ],
)
def test_invalid_content_is_refused_with_the_path(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        HarnessTree.from_files(files)


def test_a_missing_directory_and_symlinks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="does not exist"):
        HarnessTree.from_dir(tmp_path / "nope")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "a.md").symlink_to("/etc/hostname")
    with pytest.raises(InvalidInput, match="symbolic links"):
        HarnessTree.from_dir(tmp_path)


def test_folded_descriptions_become_one_line() -> None:
    text = b"---\nname: a\ndescription: >\n  two\n  lines\n---\nbody"
    assert HarnessTree.from_files({"harness/skills/a/SKILL.md": text}).skills["a"].description == "two lines"


def test_mutations_apply_in_order_and_refuse_what_does_not_fit() -> None:
    tree = HarnessTree.from_files(sample_files())
    new = tree.apply(
        [
            Mutation("create", "rule", "check-empty", body="Handle the empty input."),
            Mutation("remove", "rule", "be-brief"),
            Mutation("update", "skill", "empty-token", body="New body."),
            Mutation("create", "skill", "retry", body="Retry twice.", description="When a call fails"),
            Mutation("update", "system", "", body="You are terse."),
        ]
    )
    assert sorted(new.rules) == ["check-empty", "tests-first"]
    assert new.skills["empty-token"] == Skill("empty-token", "How to handle an empty token", "New body.")
    assert new.skills["retry"].description == "When a call fails"
    assert new.system == "You are terse." and new.config == tree.config and new.extensions == tree.extensions
    assert tree.rules["be-brief"]  # the original is untouched
    with pytest.raises(InvalidInput, match="it exists"):
        tree.apply([Mutation("create", "rule", "be-brief", body="x")])
    with pytest.raises(InvalidInput, match="does not exist"):
        tree.apply([Mutation("update", "skill", "nope", body="x")])
    with pytest.raises(InvalidInput, match="does not exist"):
        tree.apply([Mutation("remove", "rule", "nope")])
    with pytest.raises(InvalidInput, match="does not exist"):
        HarnessTree().apply([Mutation("remove", "system", "")])
    assert HarnessTree().apply([Mutation("create", "system", "", body="Hi")]).system == "Hi"


@pytest.mark.parametrize(
    "obj, message",
    [
        ([], "JSON object"),
        ({"op": "create", "kind": "rule"}, "needs a name"),
        ({"kind": "rule", "name": "a"}, "needs op and kind"),
        ({"op": "rename", "kind": "rule", "name": "a", "body": "x"}, "op must be"),
        ({"op": "create", "kind": "tool", "name": "a", "body": "x"}, "kind must be"),
        ({"op": "create", "kind": "rule", "name": "A!", "body": "x"}, "rule name"),
        ({"op": "create", "kind": "rule", "name": "a", "body": " "}, "non-empty body"),
        ({"op": "create", "kind": "rule", "name": "a", "body": 3}, "must be text"),
        ({"op": "create", "kind": "skill", "name": "a", "body": "x"}, "needs a description"),
        ({"op": "create", "kind": "rule", "name": "a", "body": "x", "description": "d"}, "only skills"),
        ({"op": "create", "kind": "rule", "name": "a", "body": "x", "why": "y"}, "unknown mutation field"),
    ],
)
def test_mutation_json_is_validated(obj: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Mutation.from_json(obj)


def test_mutation_json_round_trip() -> None:
    for m in (
        Mutation("create", "skill", "a", body="b", description="d"),
        Mutation("remove", "rule", "r"),
        Mutation("update", "system", "whatever", body="s"),
    ):
        assert Mutation.from_json(m.to_json()) == m
    assert Mutation.from_json({"op": "update", "kind": "system", "body": "s"}).name == "system"


def test_render_has_system_rules_catalogue_and_only_the_skills_mentioned() -> None:
    tree = HarnessTree.from_files(sample_files()).apply(
        [Mutation("create", "skill", "retry_calls", body="Retry twice.", description="When a call fails")]
    )
    plain = render_system(tree, "please fix the parser")
    assert plain.startswith("You are a careful coding agent.")
    assert "## be-brief\nAnswer in one paragraph." in plain and "## tests-first" in plain
    assert "- empty-token: How to handle an empty token" in plain and "- retry_calls: When a call fails" in plain
    assert "Check for the empty string" not in plain and "Retry twice." not in plain
    assert plain.index("be-brief") < plain.index("tests-first")  # sorted: the same text every time
    mentioned = render_system(tree, "Use the Empty Token skill, then retry calls")
    assert "## Skill: empty-token\nCheck for the empty string before parsing." in mentioned
    assert "## Skill: retry_calls\nRetry twice." in mentioned
    assert skills_needed(tree, "the empty-token case") == ["empty-token"]
    assert skills_needed(tree, "nonempty-tokens") == []  # whole words only
    assert render_system(HarnessTree(), "anything") == ""


def test_merge_files_replaces_the_harness_and_keeps_weights() -> None:
    old = sample_files()
    tree = HarnessTree(rules={"only": "One rule."})
    merged = merge_files(old, tree)
    assert merged == {"adapter_config.json": b"{}", "harness/rules/only.md": b"One rule."}
    assert artifact_kind(merged) is ArtifactKind.BOTH
    assert artifact_kind(tree.to_files()) is ArtifactKind.HARNESS
    assert artifact_kind({"adapter_config.json": b"{}"}) is ArtifactKind.WEIGHTS
    assert artifact_kind({}) is ArtifactKind.EMPTY


def test_constructing_a_tree_validates_it() -> None:
    with pytest.raises(InvalidInput, match="rule name"):
        HarnessTree(rules={"Bad": "x"})
    with pytest.raises(InvalidInput, match="must be a Skill named"):
        HarnessTree(skills={"a": Skill("b", "d", "x")})
    with pytest.raises(InvalidInput, match="extension path"):
        HarnessTree(extensions={"../x": b""})
