"""A runtime that forwards to an OpenAI- or Anthropic-compatible provider over HTTP.

The internal `ChatRequest` goes out in the upstream's own dialect (`to_openai_body`,
`to_anthropic_body`), whatever dialect the client spoke; the answer (whole JSON or SSE) comes
back as `TextDelta` / `ToolCallDelta` / `Finish`. Tool calls are emitted whole, once their
streamed argument fragments are complete. Every failure is a `RuntimeFailure`: the provider's
own 4xx is relayed with its status and message, anything else (refused, reset, timed out,
malformed, cut short, 5xx) is 502. The api key is only ever a request header and is scrubbed
from every message this module produces.

Redirects are never followed: one would re-send the whole prompt wherever the provider points
(with an Anthropic key: aiohttp drops only `Authorization` across hosts, not `x-api-key`), or
turn the POST into a GET; a 3xx is a 502 naming it. An answer (a whole body, or a stream in
all) is read as it arrives and refused once it passes `max_response_bytes`, never buffered
whole first. A relayed error keeps the provider's `Retry-After` (and OpenAI's
`retry-after-ms`), so the client's SDK waits as the provider asked.

The connection pool is aiohttp's (measured here: about 0.34 ms of CPU per request against
1.9 ms for httpx's async client, which dominated Reef's added latency), with no cap on its
connections: each request in flight holds its own, so requests the provider holds (a stuck call,
a long stream, a client reading slowly) never make another wait for a free one. A cap (it was
256) queued every other request behind them without a bound; what bounds the connections is the
requests Reef is serving, one each, and idle ones are reused or closed. `timeout` bounds each
read, not the whole call: a stream may run longer than it, but no single wait for data
(including the wait for the response head) may stall for longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from typing import Any, AsyncIterator, Iterator, Literal, Mapping
from urllib.parse import urlsplit

import aiohttp

from reef.core.chat import ChatRequest, Delta
from reef.core.errors import InvalidInput, ReefError, RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.base import Runtime
from reef.runtimes.upstream_wire import (
    ANTHROPIC_VERSION,
    DEFAULT_MAX_RESPONSE_BYTES,
    JSON,
    AnswerTooLarge,
    AnthropicStream,
    OpenAIStream,
    SSEParser,
    UpstreamProblem,
    coalesce_text,
    error_text,
    loads_json,
    to_anthropic_body,
    to_openai_body,
)

RETRY_HEADERS = ("retry-after", "retry-after-ms")
ERROR_BODY_BYTES = 64 * 1024  # of an error answer, enough for its message; the rest is not read


class UpstreamRuntime(Runtime):
    name = "upstream"
    verifies_tokens = False

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        dialect: Literal["openai", "anthropic"] = "openai",
        pass_model_through: bool = False,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if dialect not in ("openai", "anthropic"):
            raise InvalidInput(f"upstream dialect must be openai or anthropic, not {dialect!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.dialect = dialect
        self.pass_model_through = pass_model_through
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=timeout)
        self._max_response_bytes = max_response_bytes
        self._client: aiohttp.ClientSession | None = None
        self._incarnation = uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)
        self.loads_json: set[str] = set()
        parts = urlsplit(self.base_url)
        self._where = parts.netloc.rpartition("@")[2] or self.base_url  # never userinfo
        if dialect == "openai":
            self._url = f"{self.base_url}/chat/completions"
            self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        else:
            root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
            self._url = f"{root}/v1/messages"
            self._headers = {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": api_key} if api_key else {})}

    async def start(self) -> None:
        if self._client is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)  # no cap: see the module's docstring
            self._client = aiohttp.ClientSession(
                timeout=self._timeout, connector=connector, headers=self._headers, auto_decompress=True
            )

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def served_models(self) -> list[str]:
        return [self.model] if self.model else []

    async def load(self, content_id: str, files: Mapping[str, bytes]) -> str:
        weights = sorted(name for name in files if name.endswith(".safetensors") and not name.startswith("harness/"))
        if weights:
            raise RuntimeFailure(
                f"content {content_id} holds weights ({weights[0]}); an upstream cannot serve weights",
                error_type="unsupported_content",
            )
        load_id = f"upstream:{self._incarnation}:{next(self._counter)}"
        self.loads_json.add(load_id)
        return load_id

    async def unload(self, runtime_load_id: str) -> None:
        self.loads_json.discard(runtime_load_id)

    def _model_for(self, request: ChatRequest) -> str:
        """The model named upstream: the configured one, or the client's when passing through
        (or when none is configured)."""
        if self.model and not (self.pass_model_through and request.model):
            return self.model
        return request.model

    def _fail(self, message: str, status: int = 502, error_type: str = "upstream_error") -> RuntimeFailure:
        if self._api_key:
            message = message.replace(self._api_key, "[redacted]")
        return RuntimeFailure(message, status=status, error_type=error_type)

    def _post(self, url: str, body: JSON) -> Any:
        assert self._client is not None
        return self._client.post(url, json=body, allow_redirects=False)

    async def _check_status(self, response: aiohttp.ClientResponse) -> None:
        """A redirect or an error status becomes a RuntimeFailure (a provider's 4xx relayed)."""
        if response.status < 300:
            return
        if response.status < 400:
            location = response.headers.get("location", "(no Location header)")[:300]
            raise self._fail(
                f"upstream {self._where} answered {response.status}, a redirect to {location}; Reef does "
                "not follow provider redirects: set upstream.url to the address that answers"
            )
        failure = self._status_failure(response.status, await _error_body(response))
        raise failure.with_headers(_retry_headers(response.headers))

    def _status_failure(self, status: int, raw: bytes) -> RuntimeFailure:
        try:
            message, kind = error_text(json.loads(raw))
        except ValueError:
            message, kind = raw[:500].decode("utf-8", "replace").strip() or "(empty body)", None
        if 400 <= status < 500:
            return self._fail(
                f"upstream {self._where} refused the request ({status}): {message}",
                status,
                kind or "invalid_request_error",
            )
        return self._fail(f"upstream {self._where} failed ({status}): {message}")

    async def _read_answer(self, response: aiohttp.ClientResponse) -> bytes:
        """The whole body, refused as soon as it passes max_response_bytes."""
        limit = self._max_response_bytes
        if (response.content_length or 0) > limit:
            raise AnswerTooLarge("an answer", limit)
        pieces: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise AnswerTooLarge("an answer", limit)
            pieces.append(chunk)
        return b"".join(pieces)

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """Parser problems and transport errors become scrubbed 502s."""
        try:
            yield
        except ReefError:
            raise
        except UpstreamProblem as exc:
            raise self._fail(f"upstream {self._where} {exc}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:  # JSON of the wrong shape
            raise self._fail(
                f"upstream {self._where} sent an answer of an unexpected shape ({type(exc).__name__})"
            ) from None
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise self._fail(f"upstream {self._where} timed out ({type(exc).__name__})") from None
        except aiohttp.ClientConnectorError as exc:
            raise self._fail(f"could not connect to upstream {self._where}: {exc or type(exc).__name__}") from None
        except aiohttp.ClientError as exc:  # reset, protocol violations, cut bodies
            detail = f": {exc}" if str(exc) else ""
            raise self._fail(f"connection to upstream {self._where} broke ({type(exc).__name__}){detail}") from None

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        load_id = release.runtime_load_id
        if load_id is not None and load_id not in self.loads_json:
            raise self._fail(f"runtime load {load_id} is not loaded on this upstream runtime")
        model = self._model_for(request)
        body = to_openai_body(request, model) if self.dialect == "openai" else to_anthropic_body(request, model)
        parser = OpenAIStream(load_id) if self.dialect == "openai" else AnthropicStream(load_id)
        await self.start()
        with self._translated():
            if not request.stream:
                async with self._post(self._url, body) as response:
                    await self._check_status(response)
                    raw = await self._read_answer(response)
                for delta in parser.whole(loads_json(raw)):
                    yield delta
                return
            async with self._post(self._url, body) as response:
                await self._check_status(response)
                events = SSEParser(self._max_response_bytes)
                received = 0
                async for chunk in response.content.iter_any():
                    received += len(chunk)
                    if received > self._max_response_bytes:
                        raise AnswerTooLarge("a stream", self._max_response_bytes)
                    # after the finish, read to the end so the connection is reused
                    deltas = [
                        d for event, data in events.feed(chunk) if not parser.done for d in parser.feed(event, data)
                    ]
                    for delta in coalesce_text(deltas):
                        yield delta
                for event, data in events.close():
                    if not parser.done:
                        for delta in parser.feed(event, data):
                            yield delta
            if not parser.done:
                for delta in parser.end():
                    yield delta

    async def count_tokens(self, request: ChatRequest) -> int:
        """Anthropic upstream: its own count_tokens. OpenAI upstream: an ESTIMATE, since the
        chat-completions API has no counting endpoint: characters // 4 + 4 per message."""
        if self.dialect == "openai":
            chars = sum(
                len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls) for m in request.messages
            )
            chars += sum(len(t.name) + len(t.description or "") + len(json.dumps(t.parameters)) for t in request.tools)
            return chars // 4 + 4 * len(request.messages)
        body = to_anthropic_body(request, self._model_for(request))
        for key in ("max_tokens", "stream", "temperature", "top_p", "stop_sequences"):
            body.pop(key, None)
        await self.start()
        with self._translated():
            async with self._post(f"{self._url}/count_tokens", body) as response:
                await self._check_status(response)
                raw = await self._read_answer(response)
            count = loads_json(raw)
            if not isinstance(count, dict) or not isinstance(count.get("input_tokens"), int):
                raise UpstreamProblem("answered count_tokens without input_tokens")
            return int(count["input_tokens"])


async def _error_body(response: aiohttp.ClientResponse) -> bytes:
    """The start of an error answer (up to ERROR_BODY_BYTES); the rest is never read."""
    head = bytearray()
    async for chunk in response.content.iter_any():
        head += chunk
        if len(head) >= ERROR_BODY_BYTES:
            break
    return bytes(head[:ERROR_BODY_BYTES])


def _retry_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The provider's advice on when to retry, relayed as is when it is a short plain value."""
    return {
        name: value
        for name in RETRY_HEADERS
        if (value := headers.get(name)) is not None and len(value) <= 64 and value.isascii() and value.isprintable()
    }
