"""Settings: layered YAML < environment < flags, unknown keys named, exposure refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pydantic import BaseModel

from reef.config import RECIPES, ServeConfig, find_recipe, load_config
from reef.core.errors import InvalidInput

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_layers_yaml_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("port: 9001\nupstream:\n  url: http://yaml/v1\n  model: from-yaml\n")
    env = {"REEF_UPSTREAM_MODEL": "from-env", "REEF_TOKEN": "a, b"}
    config = load_config(path, env=env, port=9002)
    assert config.port == 9002 and config.upstream.url == "http://yaml/v1"
    assert config.upstream.model == "from-env" and config.tokens == ["a", "b"]
    assert config.runtime_kind == "upstream"
    assert load_config(None, env={}).runtime_kind == "embedded"


def test_unknown_keys_are_named(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("upstream:\n  modle: x\nprot: 1\n")
    with pytest.raises(InvalidInput) as info:
        load_config(path, env={})
    assert "unknown key 'upstream.modle'" in str(info.value) and "unknown key 'prot'" in str(info.value)


def test_a_non_loopback_address_needs_a_token_or_insecure() -> None:
    with pytest.raises(InvalidInput, match="REEF_TOKEN"):
        ServeConfig(host="0.0.0.0").check_exposure()
    ServeConfig(host="0.0.0.0", tokens=["t"]).check_exposure()
    ServeConfig(host="0.0.0.0", insecure=True).check_exposure()
    ServeConfig(host="::1").check_exposure()


def test_every_setting_is_documented() -> None:
    documented = DOCS.read_text()

    def keys(model: type, prefix: str = "") -> list[str]:
        out = []
        for name, field in model.model_fields.items():
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out += keys(sub, f"{prefix}{name}.")
            out.append(prefix + name)
        return out

    recipe_keys = [key for name in RECIPES for key in keys(find_recipe(name).Settings, f"learner.{name}.")]
    for key in keys(ServeConfig) + recipe_keys:
        leaf = key.split(".")[-1]
        assert re.search(rf"^\s*{leaf}:", documented, re.M), f"setting {key} is missing from docs/configuration.md"


def test_an_unknown_recipe_is_refused_when_the_config_loads_naming_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("recipes:\n  scenarios: {math: saoo}\n")
    with pytest.raises(InvalidInput, match=r"recipes.scenarios: unknown recipe 'saoo'; known recipes: sao, skills"):
        load_config(path, env={})
    path.write_text("learner:\n  sao: {batch_size: 0}\n  skils: {}\n")
    with pytest.raises(InvalidInput, match=r"learner.sao.batch_size: Input should be greater"):
        load_config(path, env={})
    path.write_text("learner:\n  skils: {}\n")
    with pytest.raises(InvalidInput, match=r"unknown key 'learner.skils'"):
        load_config(path, env={})
    path.write_text("recipes:\n  default: reef.config:ServeConfig\n")  # a class, but no recipe
    with pytest.raises(InvalidInput, match="lacks name, surface, Settings"):
        load_config(path, env={})
    path.write_text("recipes:\n  default: reef.recipes.sao:SAORecipe\nlearner:\n  reef.recipes.sao:SAORecipe: {lr: 0.1}\n")
    assert load_config(path, env={}).learner.settings_for("reef.recipes.sao:SAORecipe").lr == 0.1


def test_reef_serve_with_an_unknown_recipe_exits_before_binding_anything(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("recipes:\n  default: nope\n")
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-m", "reef", "serve", "-c", str(path), "--state-dir", str(state),
                           "--port", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "unknown recipe 'nope'; known recipes: sao, skills" in done.stderr
    assert not state.exists()
