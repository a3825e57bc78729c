"""A model Reef asks for itself (the LLM proposer, a judge): one prompt in, one text out.

A configured endpoint (`url`, `api_key`, `model`, `dialect`) becomes its own upstream runtime;
without a `url` the scenario's own runtime answers, on the load of the release it serves (the
harness is not applied: the model sees only the prompt Reef built).
"""

from __future__ import annotations

from typing import Sequence

from reef.config import ModelEndpointConfig
from reef.core.chat import ChatRequest, ChatResult, Message
from reef.core.types import ReleaseRef
from reef.runtimes.base import Runtime

_BASE_LOAD = ReleaseRef("reef-internal", "reef-internal", None)


class ModelEndpoint:
    def __init__(self, config: ModelEndpointConfig, fallback: Runtime) -> None:
        self.config = config
        self.own = config.url is not None
        if self.own:
            from reef.runtimes.upstream import UpstreamRuntime

            assert config.url is not None
            self.runtime: Runtime = UpstreamRuntime(
                config.url, api_key=config.api_key, model=config.model, dialect=config.dialect, timeout=config.timeout
            )
        else:
            self.runtime = fallback

    @property
    def where(self) -> str:
        return self.config.url or f"the scenario's {self.runtime.name} runtime"

    async def ask(self, messages: Sequence[Message], serving: ReleaseRef) -> str:
        """The model's whole text answer (RuntimeFailure when it cannot answer). `serving`: the
        scenario's serving release, used when the scenario's own runtime answers."""
        request = ChatRequest(
            model=self.config.model or "reef-internal",
            messages=tuple(messages),
            dialect="openai",
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        result = ChatResult()
        async for delta in self.runtime.generate(request, _BASE_LOAD if self.own else serving):
            result.add(delta)
        return result.text

    async def close(self) -> None:
        if self.own:
            await self.runtime.close()
