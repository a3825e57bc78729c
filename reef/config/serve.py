"""The settings model of `reef serve`: where it listens, what it stores, and one section per part."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from reef.config.learner import LearnerConfig, RecipeConfig
from reef.config.runtimes import EmbeddedConfig, SGLangConfig, UpstreamConfig, VLLMConfig
from reef.config.strict import Strict
from reef.core.errors import InvalidInput
from reef.core.urls import checked_url, is_loopback

DEFAULT_PORT = 8900


class HarnessScenarioConfig(Strict):
    mode: Literal["inject", "pull"] | None = Field(None, description="Overrides harness.mode for this scenario")
    seed_dir: Path | None = Field(None, description="Overrides harness.seed_dir for this scenario")


class HarnessConfig(Strict):
    """How a scenario's harness is applied and what a new scenario starts with (docs/harness.md)."""

    mode: Literal["inject", "pull"] = Field(
        "inject", description="inject: added to each request; pull: clients fetch it"
    )
    seed_dir: Path | None = Field(None, description="A harness directory every new scenario starts with")
    scenarios: dict[str, HarnessScenarioConfig] = Field(default_factory=dict, description="Per-scenario overrides")

    def mode_for(self, scenario: str) -> str:
        override = self.scenarios.get(scenario)
        return (override.mode if override and override.mode else None) or self.mode

    def seed_dir_for(self, scenario: str) -> Path | None:
        override = self.scenarios.get(scenario)
        return (override.seed_dir if override and override.seed_dir else None) or self.seed_dir


class TracesConfig(Strict):
    """OpenTelemetry spans per request (docs/observability.md); needs the `traces` extra."""

    enabled: bool = Field(False, description="Make spans; also on when otlp_endpoint is set")
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP base URL; default OTEL_EXPORTER_OTLP_ENDPOINT")

    @property
    def on(self) -> bool:
        return self.enabled or self.otlp_endpoint is not None


class ArtifactsConfig(Strict):
    """Where release contents are shared between front ends (docs/deploy.md)."""

    remote: str | None = Field(
        None,
        description="A git URL or the path of a bare repository every front end "
        "publishes to and fetches from; default: none (one node)",
    )


class RequestLimits(Strict):
    """What one request may ask of the server beyond its body size (docs/RELIABILITY.md)."""

    max_header_bytes: int = Field(64 * 1024, ge=4096, description="All request headers together; past it, 431")
    max_tags: int = Field(32, ge=0, description="x-reef-tag-* headers on one request; past it, 400")
    max_tag_bytes: int = Field(1024, ge=1, description="One x-reef-tag-* value; past it, 400")
    max_json_depth: int = Field(64, ge=8, description="Nesting of arrays and objects in a body; past it, 400")
    max_report_references: int = Field(1000, ge=1, description="Receipts one report may name; past it, 400")
    max_scenarios: int = Field(
        1000, ge=1, description="Scenarios the state may hold; creating one more answers 403 and creates nothing"
    )
    stream_send_timeout: float = Field(
        30.0, gt=0, description="Seconds a streaming client may read nothing before its stream is dropped"
    )


class ServeConfig(Strict):
    host: str = Field("127.0.0.1", description="Address to listen on; beyond loopback it needs a token, or insecure")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="Port to listen on (0: any free port)")
    state_dir: Path = Field(Path(".reef"), description="Where records, reports, commit logs and artifacts live")
    tokens: list[str] = Field(
        default_factory=list,
        description="Accepted bearer tokens, several at once for rotation; "
        "with none, only loopback Host values are served",
    )
    insecure: bool = Field(
        False, description="Allow a non-loopback address without a token (the Host check is then off)"
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body; past it, 413 (a batch import's: 16 times this)",
    )
    unsupported_tools: Literal["drop", "refuse"] = Field(
        "drop",
        description="A client tool Reef cannot serve (a provider-run web_search, a custom tool): drop leaves "
        "it out with an x-reef-warning header and a note in the record, refuse answers 400",
    )
    limits: RequestLimits = Field(default_factory=RequestLimits)
    runtime: Literal["embedded", "upstream", "vllm", "sglang"] | None = Field(
        None, description="The runtime that answers; default: upstream when upstream.url is set, else embedded"
    )
    store: str = Field(
        "sqlite",
        description="sqlite (in state_dir) or a postgresql:// DSN shared by several front ends (docs/state.md)",
    )
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    shared_state_dir: bool = Field(
        False,
        description="Several processes on this machine serve state_dir together, "
        "one learner a scenario by a file lock (--workers sets it; "
        "docs/deploy.md)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Level of Reef's and uvicorn's log lines (other libraries: warning and up)"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="text: key=value lines; json: one object a line (never a token, key, prompt or answer)"
    )
    public_url: str | None = Field(None, description="The URL the agent install script names; default: the Host asked")
    keep_alive_timeout: float = Field(5.0, gt=0, description="Seconds an idle connection stays open after an answer")
    header_timeout: float = Field(10.0, gt=0, description="Seconds a client has to send a whole request head")
    body_timeout: float = Field(30.0, gt=0, description="Seconds a request body may fall silent")
    shutdown_timeout: float = Field(15.0, ge=0, description="Seconds SIGTERM waits for running requests, then cancels")
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    embedded: EmbeddedConfig = Field(default_factory=EmbeddedConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    sglang: SGLangConfig = Field(default_factory=SGLangConfig)
    recipes: RecipeConfig = Field(default_factory=RecipeConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)

    @field_validator("tokens")
    @classmethod
    def _no_empty_tokens(cls, tokens: list[str]) -> list[str]:
        if any(not t.strip() for t in tokens):
            raise ValueError("tokens must not be empty strings")
        return tokens

    @field_validator("public_url")
    @classmethod
    def _plain_public_url(cls, url: str | None) -> str | None:
        return None if url is None else checked_url(url)  # the rule every URL baked into a script meets

    @model_validator(mode="after")
    def _one_engine_one_set_of_full_weights(self) -> ServeConfig:
        """An engine holds one set of full weights for every request: a candidate answered there
        (a canary, the gate's tasks on the runtime) would serve the serving release's traffic."""
        if self.learner.weights != "full" or self.runtime_kind not in ("vllm", "sglang"):
            return self
        if self.learner.canary:
            raise ValueError(
                f"learner.canary with learner.weights: full on {self.runtime_kind}: the candidate's weights "
                "would be pushed into the one engine every request shares; leave the canary off"
            )
        if self.learner.gate.tasks is not None and self.learner.gate.answer_on == "runtime":
            raise ValueError(
                f"learner.gate.answer_on: runtime with learner.weights: full on {self.runtime_kind}: each "
                "candidate would be pushed into the serving engine to be judged; set "
                "learner.gate.answer_on: trainer (and learner.gate.temperature: 0)"
            )
        return self

    @property
    def runtime_kind(self) -> str:
        return self.runtime or ("upstream" if self.upstream.url else "embedded")

    def check_exposure(self) -> None:
        """Refuse to listen beyond loopback without a token, unless told `insecure`."""
        if self.tokens or self.insecure or is_loopback(self.host):
            return
        raise InvalidInput(
            f"refusing to listen on {self.host} without a token: set REEF_TOKEN (or tokens: in the config), "
            "or pass --insecure if this network is trusted"
        )
