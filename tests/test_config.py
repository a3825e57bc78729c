"""Settings: layered YAML < environment < flags, unknown keys named, exposure refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


# -- every setting from the environment ----------------------------------------------------------


def test_any_setting_from_the_environment_with_nested_keys() -> None:
    config = load_config(
        None,
        env={
            "REEF_UPSTREAM__TIMEOUT": "30",
            "REEF_LEARNER__SAO__LR": "1e-4",
            "REEF_LIMITS__MAX_TAGS": "8",
            "REEF_LEARNER__ENABLED": "false",
            "REEF_PORT": "9100",
            "REEF_EMBEDDED__THREADS": "null",
            "REEF_TOKENS": '["one", "two"]',  # JSON for a list
            "REEF_RECIPES__SCENARIOS__CODING": "skills",  # a key of a mapping
            "REEF_HARNESS__SCENARIOS": '{"review": {"mode": "pull"}}',  # a whole mapping
            "REEF_LEARNER__SKILLS__GATE__JUDGE__MODEL": "gpt-4o-mini",  # inside an optional section
            "REEF_UPSTREAM__API_KEY": "12345",  # text stays text, even when it looks like a number
            "REEF_UPSTREAM__MODEL": "1.5",
            "REEF_PUBLIC_URL": "null",
            "REEF_LOG_FORMAT": "",  # empty: unset
        },
    )
    assert config.upstream.timeout == 30.0 and config.learner.sao.lr == 1e-4 and config.limits.max_tags == 8
    assert config.learner.enabled is False and config.port == 9100 and config.embedded.threads is None
    assert config.tokens == ["one", "two"] and config.recipes.scenarios == {"coding": "skills"}
    assert config.harness.scenarios["review"].mode == "pull"
    assert config.learner.skills.gate.judge is not None and config.learner.skills.gate.judge.model == "gpt-4o-mini"
    assert config.upstream.api_key == "12345" and config.upstream.model == "1.5" and config.public_url is None
    assert config.log_format == "text"


def test_the_five_older_names_are_kept(tmp_path: Path) -> None:
    config = load_config(
        None,
        env={
            "REEF_TOKEN": "a,b",
            "REEF_STATE_DIR": str(tmp_path),
            "REEF_UPSTREAM_URL": "http://u/v1",
            "REEF_UPSTREAM_API_KEY": "sk-1",
            "REEF_UPSTREAM_MODEL": "m",
        },
    )
    assert config.tokens == ["a", "b"] and config.state_dir == tmp_path
    assert (config.upstream.url, config.upstream.api_key, config.upstream.model) == ("http://u/v1", "sk-1", "m")
    assert load_config(None, env={"REEF_UPSTREAM__URL": "http://n/v1"}).upstream.url == "http://n/v1"


def test_every_setting_has_a_variable_that_sets_it() -> None:
    """Each setting's default, written as its variable, reads back as itself."""
    import json

    from pydantic import BaseModel

    def leaves(model: type[BaseModel], name: str, attrs: tuple[str, ...]) -> list[tuple[str, tuple[str, ...], object]]:
        out = []
        for key, field in model.model_fields.items():
            sub = field.annotation
            options = [a for a in getattr(sub, "__args__", ()) if a is not type(None)] or [sub]
            inner = options[0] if len(options) == 1 else None
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                out += leaves(inner, f"{name}{key.upper()}__", attrs + (key,))
            else:
                out.append((f"{name}{key.upper()}", attrs + (key,), field.get_default(call_default_factory=True)))
        return out

    from reef.config import RECIPES, find_recipe

    found = leaves(ServeConfig, "REEF_", ())
    for recipe in RECIPES:  # learner.<recipe>: each built-in recipe's own section
        found += leaves(find_recipe(recipe).Settings, f"REEF_LEARNER__{recipe.upper()}__", ("learner", recipe))
    assert len(found) > 80 and ("REEF_LEARNER__SAO__LR", ("learner", "sao", "lr"), 5e-4) in found
    for name, attrs, default in found:
        written = str(default) if isinstance(default, (str, Path)) else json.dumps(default)
        value: object = load_config(None, env={name: written})
        for attr in attrs:
            value = getattr(value, attr)
        assert value == default, name


def test_an_unknown_variable_is_named_and_a_single_underscore_gets_a_hint() -> None:
    with pytest.raises(InvalidInput) as info:
        load_config(None, env={"REEF_PROT": "1", "REEF_UPSTREAM_TIMEOUT": "3", "REEF_PORT__X": "1"})
    message = str(info.value)
    assert "REEF_PROT names no setting" in message and "REEF_PORT__X names no setting" in message
    assert "REEF_UPSTREAM_TIMEOUT names no setting (did you mean REEF_UPSTREAM__TIMEOUT?" in message


def test_a_bad_value_names_its_variable_and_one_setting_is_set_once() -> None:
    for env, expected in [
        ({"REEF_UPSTREAM__TIMEOUT": "-1"}, "REEF_UPSTREAM__TIMEOUT: Input should be greater than 0"),
        ({"REEF_UPSTREAM__DIALECT": "grpc"}, "REEF_UPSTREAM__DIALECT: Input should be 'openai'"),
        ({"REEF_TOKENS": "[1"}, "REEF_TOKENS: not a YAML value"),
        ({"REEF_TOKEN": "a", "REEF_TOKENS": '["b"]'}, "REEF_TOKEN and REEF_TOKENS both set tokens"),
        ({"REEF_UPSTREAM_URL": "http://a", "REEF_UPSTREAM__URL": "http://b"}, "both set upstream.url"),
    ]:
        with pytest.raises(InvalidInput) as info:
            load_config(None, env=env)
        assert expected in str(info.value), (env, str(info.value))


def test_variables_that_are_not_settings_are_left_alone() -> None:
    """The client commands', the agent wrapper's, the cache's and the tests' REEF_ variables."""
    from reef.config import ENV_NOT_SETTINGS

    env = {name: "x" for name in ENV_NOT_SETTINGS} | {"REEF_AGENT_HOME": "/tmp", "REEF_AGENT_COMMAND": "claude"}
    assert load_config(None, env=env) == ServeConfig()
    documented = DOCS.read_text()
    assert all(f"`{name}`" in documented for name in ENV_NOT_SETTINGS), "docs/configuration.md lists them"


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
    path.write_text(
        "recipes:\n  default: reef.recipes.sao:SAORecipe\nlearner:\n  reef.recipes.sao:SAORecipe: {lr: 0.1}\n"
    )
    assert load_config(path, env={}).learner.settings_for("reef.recipes.sao:SAORecipe").lr == 0.1


def test_reef_serve_with_an_unknown_recipe_exits_before_binding_anything(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("recipes:\n  default: nope\n")
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "reef", "serve", "-c", str(path), "--state-dir", str(state), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "unknown recipe 'nope'; known recipes: sao, skills" in done.stderr
    assert not state.exists()


def test_a_gate_bounded_only_when_starved_needs_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("learner:\n  gate: {concurrency_when: starved}\n")
    with pytest.raises(InvalidInput, match=r"learner.gate: concurrency_when: starved needs concurrency"):
        load_config(path, env={})
    path.write_text("learner:\n  gate: {concurrency: 4, concurrency_when: starved}\n")
    assert load_config(path, env={}).learner.gate.concurrency == 4


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_full_weights_on_an_engine_refuse_what_would_push_a_candidate_into_it(tmp_path: Path, engine: str) -> None:
    path = tmp_path / "serve.yaml"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    full = f"runtime: {engine}\nlearner:\n  weights: full\n"
    path.write_text(full + "  canary: {demo: 0.1}\n")
    with pytest.raises(InvalidInput, match=r"learner.canary with learner.weights: full on " + engine):
        load_config(path, env={})
    path.write_text(full + f"  gate: {{tasks: {tasks}}}\n")
    with pytest.raises(InvalidInput, match=r"set learner.gate.answer_on: trainer"):
        load_config(path, env={})
    path.write_text(full + f"  gate: {{tasks: {tasks}, answer_on: trainer}}\n")
    assert load_config(path, env={}).learner.gate.answer_on == "trainer"
    path.write_text("runtime: embedded\nlearner:\n  weights: full\n  canary: {demo: 0.1}\n")
    assert load_config(path, env={}).learner.canary == {"demo": 0.1}  # a model per load: no sharing


# -- recipes' shared settings and the Recipe protocol ---------------------------------------------


class HarnessRecipeWithoutGate:
    """A harness recipe that names no gate settings: what `find_recipe` must refuse."""

    name = "gateless"
    surface = "harness"
    Settings = ServeConfig
    intake = next_batch = resume = high_water = candidate = status = close = None


def test_every_weights_recipe_shares_one_declaration_of_lora_and_optimiser_settings(tmp_path: Path) -> None:
    from reef.config.training import WeightsTrainingConfig

    weights = [find_recipe(name) for name in RECIPES if find_recipe(name).surface == "weights"]
    assert {recipe.name for recipe in weights} == {"sao", "ttt_discover", "openclaw_rl"}
    for recipe in weights:
        assert issubclass(recipe.Settings, WeightsTrainingConfig)
        for name in WeightsTrainingConfig.model_fields:  # each declared once, in the shared model
            declaring = [cls for cls in recipe.Settings.__mro__ if name in vars(cls).get("__annotations__", {})]
            assert declaring[-1] is WeightsTrainingConfig, (recipe.name, name)
    path = tmp_path / "serve.yaml"  # the keys users write are as before, each recipe's defaults its own
    path.write_text("learner:\n  ttt_discover: {lora_r: 8, lr: 3.0e-4}\n  openclaw_rl: {lr: 1.0e-4}\n")
    learner = load_config(path, env={}).learner
    ttt = learner.settings_for("ttt_discover")
    assert (ttt.lora.r, ttt.adam.lr, ttt.kl_coef) == (8, 3.0e-4, 0.05)
    assert learner.settings_for("openclaw_rl").adam.lr == 1e-4 and learner.settings_for("sao").steps_per_candidate == 2
    path.write_text("learner:\n  ttt_discover: {lora_rank: 8}\n")
    with pytest.raises(InvalidInput, match=r"unknown key 'learner.ttt_discover.lora_rank'"):
        load_config(path, env={})


def test_a_harness_recipe_names_its_gate_settings_in_the_protocol(tmp_path: Path) -> None:
    from reef.config import HarnessGateConfig
    from reef.recipes.skills import SkillsConfig

    skills = find_recipe("skills")
    recipe = skills(SkillsConfig(gate=HarnessGateConfig(margin=3)), proposer=object())  # type: ignore[arg-type]
    assert recipe.harness_gate.margin == 3
    harness = {"skills", "skillclaw"}
    assert all(find_recipe(name).harness_gate is None for name in RECIPES if name not in harness)
    assert all(isinstance(find_recipe(name).harness_gate, property) for name in harness)
    path = tmp_path / "serve.yaml"
    path.write_text("recipes:\n  default: tests.test_config:HarnessRecipeWithoutGate\n")
    with pytest.raises(InvalidInput, match="harness recipe without harness_gate"):
        load_config(path, env={})


def test_a_removed_setting_is_named_with_what_became_of_it(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("learner:\n  gate: {overtake_after: 8, margni: 0.1}\n")
    with pytest.raises(InvalidInput) as info:
        load_config(path, env={})
    message = str(info.value)
    assert "'learner.gate.overtake_after' was removed: every verdict runs to its decision" in message
    assert "delete it from the config" in message and "unknown key 'learner.gate.margni'" in message
    for recipe, key in [
        ("sao", "baseline_decay"),
        ("ttt_discover", "entropic_kl"),
        ("ttt_discover", "max_open_groups"),
        ("sao", "warmup_steps"),
        ("skills", "max_pending"),
        ("skills", "similarity"),
    ]:
        path.write_text(f"learner:\n  {recipe}: {{{key}: 1}}\n")
        with pytest.raises(InvalidInput, match=f"'learner.{recipe}.{key}' was removed: .*; delete it from the config"):
            load_config(path, env={})
