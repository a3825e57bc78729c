"""The runtime interface: what serves one release's content.

A runtime answers a `ChatRequest` for a release frozen at admission with a stream of deltas
(`TextDelta`, `ToolCallDelta`, then exactly one `Finish`). `load(content)` makes a release's
content servable and returns a fresh `runtime_load_id` (a reload of the same content gets a new
one); `unload` frees it once nothing pins it. Runtimes that produce tokens themselves stamp each
`TextDelta` with the `runtime_load_id` that produced it and give token ids and log-probs, so the
record can be verified and trained on (`verifies_tokens`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import AsyncIterator, Mapping

from reef.core.chat import ChatRequest, Delta
from reef.core.types import ReleaseRef


class Runtime(ABC):
    name: str = "runtime"
    verifies_tokens: bool = False

    async def start(self) -> None:
        """Get ready to serve (load weights, open connection pools)."""

    async def close(self) -> None:
        """Release everything `start` took."""

    @abstractmethod
    def served_models(self) -> list[str]:
        """Model names `GET /v1/models` lists."""

    @abstractmethod
    def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        """Answer `request` with the content loaded as `release.runtime_load_id`. Raises
        `RuntimeFailure` (before or during the stream) when it cannot."""

    @abstractmethod
    async def count_tokens(self, request: ChatRequest) -> int:
        """Input tokens the request would take (Anthropic's count_tokens)."""

    @abstractmethod
    async def load(self, content_id: str, files: Mapping[str, bytes]) -> str:
        """Make a release's content servable; return a new runtime_load_id."""

    @abstractmethod
    async def unload(self, runtime_load_id: str) -> None:
        """Forget a load; generating with it afterwards is an error."""


def loads_trained_weights(runtime: Runtime) -> bool:
    """Whether the runtime can serve weights Reef trains (an upstream provider cannot; SGLang
    only with its model folder here, `sglang.model_dir`)."""
    return getattr(runtime, "model_dir", None) is not None
