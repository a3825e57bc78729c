"""Settings: layered YAML < environment < flags, unknown keys named, exposure refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reef.config import ServeConfig, load_config
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
            if isinstance(sub, type) and issubclass(sub, ServeConfig.__base__) and sub is not ServeConfig.__base__:
                out += keys(sub, f"{name}.")
            out.append(prefix + name)
        return out

    for key in keys(ServeConfig):
        leaf = key.split(".")[-1]
        assert re.search(rf"^\s*{leaf}:", documented, re.M), f"setting {key} is missing from docs/configuration.md"
