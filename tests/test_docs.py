"""The docs cannot drift: every route, setting and status field is documented, and every link
resolves inside the repository (datasette's documentation tests are the model).

- every HTTP route the app serves is in docs/http.md (method and path);
- every key in a YAML block of docs/configuration.md is a setting (that every setting is listed
  there is tests/test_config_docs.py's);
- every field `GET /reef/status` returns, and every field of a learner's status, is in the
  status table of docs/http.md;
- no file links outside the repository (a clone has nothing beside it);
- every relative link in README.md and docs/*.md names an existing file, and its anchor an
  existing heading.
"""

from __future__ import annotations

import ast
import re
import subprocess
import types
import typing
from collections import abc
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from pydantic import BaseModel

from reef.config import RECIPES, ServeConfig, find_recipe

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
UNUSED_URL = "http://127.0.0.1:9/v1"  # the discard port: nothing answers, nothing is called


# -- helpers ---------------------------------------------------------------------------------------


def section(markdown: str, heading: str) -> str:
    """The text under `## heading` up to the next heading of the same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", markdown, re.M)
    assert match, f"no heading {heading!r}"
    level = len(match.group(1))
    rest = markdown[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def table_rows(text: str) -> Iterator[list[str]]:
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|$", line):
            yield [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def without_code_blocks(markdown: str) -> str:
    return re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)


def normal_path(path: str) -> str:
    """`/reef/scenarios/{s}` and `/reef/scenarios/{name}` are the same route."""
    return re.sub(r"\{[^}]*\}", "{}", path.split("?")[0])


# -- the app, built once, never listening ----------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real app on a temporary state directory, in front of an upstream nobody answers.
    Scenario `h` learns its harness (a `skills` learner starts), `w` would learn weights (listed
    as idle: the upstream runtime cannot load them)."""
    from fastapi.testclient import TestClient

    from reef.runtimes.upstream import UpstreamRuntime
    from reef.serve.app import create_app

    config = ServeConfig(
        state_dir=tmp_path_factory.mktemp("state"),
        recipes={"scenarios": {"h": "skills", "w": "sao"}},
        learner={"skills": {"gate": {"judge": {"url": UNUSED_URL, "model": "judge"}}}},
    )
    app = create_app(config, UpstreamRuntime(UNUSED_URL, model="m"))
    with TestClient(app, base_url="http://127.0.0.1") as test_client:  # a loopback Host: the server has no token
        for name in ("h", "w"):
            assert test_client.post("/reef/scenarios", json={"name": name}).status_code == 201
        yield test_client


# -- (a) routes -----------------------------------------------------------------------------------


def served_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path) of everything the app answers: its schema's paths, plain routes (schema
    and health), and any route of an included router, however FastAPI keeps them."""
    found: set[tuple[str, str]] = set()
    for path, operations in app.openapi()["paths"].items():
        found |= {(method.upper(), path) for method in operations}

    def add(route: Any) -> None:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if path and methods:
            found.update((m, path) for m in methods if m != "HEAD")
        for child in getattr(route, "routes", None) or ():
            add(child)
        contexts = getattr(route, "effective_route_contexts", None)
        if callable(contexts):
            for context in contexts():
                add(context)

    for route in app.routes:
        add(route)
    from reef.serve.hot_routes import HOT

    found |= {("POST", path) for path in HOT}
    return found


def documented_routes() -> set[tuple[str, str]]:
    rows = table_rows(section((DOCS / "http.md").read_text(), "Routes"))
    documented = set()
    for row in rows:
        if len(row) < 2 or not backticked(row[1]):
            continue
        for method in row[0].split(","):
            documented.add((method.strip().upper(), normal_path(backticked(row[1])[0])))
    return documented


def test_every_route_is_documented_in_http_md(client: Any) -> None:
    served = {(method, normal_path(path)) for method, path in served_routes(client.app)}
    assert ("GET", "/reef/status") in served and ("POST", "/v1/chat/completions") in served
    missing = sorted(served - documented_routes())
    assert not missing, f"routes Reef serves that docs/http.md's Routes table does not list: {missing}"


def test_every_documented_route_is_served(client: Any) -> None:
    served = {(method, normal_path(path)) for method, path in served_routes(client.app)}
    stale = sorted(documented_routes() - served)
    assert not stale, f"docs/http.md lists routes Reef does not serve: {stale}"


# -- (b) settings ---------------------------------------------------------------------------------


def _models_in(annotation: Any) -> tuple[list[type[BaseModel]], bool]:
    """The settings models an annotation holds, and whether it is a mapping or a list (its
    entries are named by the user, or numbered)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation], False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(origin, type) and issubclass(origin, (abc.Mapping, list, tuple, set)):
        inner, _ = _models_in(args[-1]) if args else ([], False)
        return inner, True
    models: list[type[BaseModel]] = []
    keyed = False
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            inner, inner_keyed = _models_in(arg)
            models += inner
            keyed |= inner_keyed
    return models, keyed


def config_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every setting as a dotted name; `*` stands for a name the user chooses (a key of a
    mapping) or an item's index."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        yield key
        models, keyed = _models_in(field.annotation)
        if keyed:
            yield f"{key}.*"
        for inner in models:
            yield from config_keys(inner, f"{key}.*." if keyed else f"{key}.")


def documented_keys() -> set[str]:
    """Dotted names of every key in the YAML blocks of docs/configuration.md."""
    keys: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for name, value in items:
            if isinstance(node, dict) or isinstance(value, (dict, list)):
                keys.add(f"{prefix}{name}")
            walk(value, f"{prefix}{name}.")

    text = (DOCS / "configuration.md").read_text()
    blocks = re.findall(r"^```ya?ml\n(.*?)^```", text, re.M | re.S)
    assert blocks, "docs/configuration.md has no yaml block"
    for block in blocks:
        walk(yaml.safe_load(block), "")
    return keys


def _key_pattern(key: str) -> re.Pattern[str]:
    return re.compile(r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in key.split(".")))


def all_config_keys() -> Iterator[str]:
    """`ServeConfig`'s keys, and each built-in recipe's settings under `learner.<its name>`."""
    yield from config_keys(ServeConfig)
    for name in RECIPES:
        yield f"learner.{name}"
        yield from config_keys(find_recipe(name).Settings, f"learner.{name}.")


def test_config_keys_walk_the_whole_model() -> None:
    keys = set(all_config_keys())
    assert {"upstream.url", "learner.sao.lr", "learner.skills.gate.judge.url", "harness.scenarios.*.mode"} <= keys


def test_every_documented_setting_exists() -> None:
    patterns = [_key_pattern(key) for key in all_config_keys()]
    stale = sorted(doc for doc in documented_keys() if not any(p.fullmatch(doc) for p in patterns))
    assert not stale, f"docs/configuration.md's yaml has keys reef.config.ServeConfig does not know: {stale}"


# -- (c) status -----------------------------------------------------------------------------------


def status_keys(value: Any, prefix: str = "") -> Iterator[str]:
    """Dotted names of a JSON value's keys; `[]` marks the items of a list of objects. Objects
    keyed by data (a scenario, a drop reason) are documented as one field; their keys are not
    field names, and they are empty here anyway."""
    if isinstance(value, dict):
        for name, inner in value.items():
            yield f"{prefix}{name}"
            yield from status_keys(inner, f"{prefix}{name}.")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                yield from status_keys(item, prefix[:-1] + "[].")


def learner_status_fields() -> set[str]:
    """The keys a learner's `status()` and its recipe's add to it can return (read from the
    source: a weights learner needs the embedded model, too slow to start here)."""
    fields: set[str] = set()
    sources = sorted((ROOT / "reef" / "grow").glob("*.py")) + sorted((ROOT / "reef" / "recipes").glob("*.py"))
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in ("status", "learner_status"):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Dict):
                        fields |= {k.value for k in inner.keys if isinstance(k, ast.Constant)}
                    elif (
                        isinstance(inner, ast.Subscript)
                        and isinstance(inner.ctx, ast.Store)
                        and isinstance(inner.slice, ast.Constant)
                    ):
                        fields.add(inner.slice.value)
    return fields


def documented_status() -> set[str]:
    """The fields the first column of docs/http.md's status table names (`a[]` names `a` too)."""
    documented: set[str] = set()
    for row in table_rows(section((DOCS / "http.md").read_text(), "Status")):
        for name in backticked(row[0]) if row else []:
            documented |= {name, name.removesuffix("[]")}
    return documented


def test_every_status_field_is_documented_in_http_md(client: Any) -> None:
    response = client.get("/reef/status")
    assert response.status_code == 200
    body = response.json()
    assert body["learning"]["learners"] and body["learning"]["idle"], "both a learner and an idle scenario"
    fields = set(status_keys(body))
    learner_fields = learner_status_fields()
    assert {"scenario", "state", "dropped"} <= learner_fields, "no learner status() found in reef/grow"
    fields |= {f"learning.learners[].{name}" for name in learner_fields}
    documented = documented_status()
    missing = sorted(fields - documented)
    assert not missing, f"/reef/status fields missing from docs/http.md's Status table: {missing}"
    stale = sorted(documented - fields - {name + "[]" for name in fields})
    assert not stale, f"docs/http.md's Status table lists fields /reef/status does not return: {stale}"


# -- (d) nothing links outside the repository ------------------------------------------------------

# spelled in pieces so this file does not match itself
OUTSIDE = ["../" + "shared", "/work/" + "shared", "DESIGN" + ".md", "EMBEDDED_MODEL" + ".md", "ENGINES" + ".md"]


def repository_files() -> list[Path]:
    try:
        listed = (
            subprocess.run(
                ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                cwd=ROOT,
                capture_output=True,
                check=True,
                timeout=30,
            )
            .stdout.decode()
            .split("\0")
        )
        files = [ROOT / name for name in listed if name]
    except (OSError, subprocess.SubprocessError):  # not a git checkout: walk it
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".reef", "build"}
        files = [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return [p for p in files if p.is_file()]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in repository_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary (images)
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {name}" for name in OUTSIDE if name in line]
    assert not found, "references to files a clone does not have:\n" + "\n".join(found)


# -- (e) links resolve ----------------------------------------------------------------------------


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in without_code_blocks(path.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.+?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    links = 0
    for path in markdown_files():
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", without_code_blocks(path.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            links += 1
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}: ({target})"
            if ROOT not in linked.parents and linked != ROOT:
                broken.append(f"{where} leaves the repository")
            elif not linked.exists():
                broken.append(f"{where} names no file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where} names no heading of {linked.relative_to(ROOT)}")
    assert links > 10, "the link pattern found almost nothing"
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_architecture_is_linked_from_the_readme() -> None:
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
