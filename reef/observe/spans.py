"""Spans for learning (training steps, gate runs): one process-wide tracer, or none.

`reef.grow` and `reef.commit` open spans through `span(...)` here; they never import
`reef.serve` or opentelemetry. `reef.serve.tracing.build` hands the request tracer to
`configure` when traces are on. Off (no tracer configured), `span` yields one shared no-op
object: no opentelemetry import, no allocation beyond the context manager.

Attributes named in `SCOPE` (`reef.scenario`, `reef.batch_id`, `reef.recipe`) are inherited by
every span opened inside one that set them (through a context variable, so concurrent learners
keep theirs apart): the training client knows only its key, yet its step spans name the batch.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Mapping

SCOPE = ("reef.scenario", "reef.batch_id", "reef.recipe")

_tracer: Any = None
_scope: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("reef_span_scope", default={})


class _NoSpan:
    """What `span` yields when traces are off: takes attributes and drops them."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def is_recording(self) -> bool:
        return False


NO_SPAN = _NoSpan()


def configure(tracer: Any) -> None:
    """Use `tracer` (an opentelemetry Tracer) for learning spans from now on; None turns them off."""
    global _tracer
    _tracer = tracer


def tracer() -> Any:
    return _tracer


def enabled() -> bool:
    return _tracer is not None


@contextlib.contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, ok: tuple[type[BaseException], ...] = ()
) -> Iterator[Any]:
    """A span around the block (the current one's child), with the scope's attributes plus
    `attributes` (None values left out). An exception escaping the block marks it an error
    (`error.type`, never its message), unless it is one of `ok` (an expected way out, such as an abandoned batch): then the span
    only names it in `reef.outcome`."""
    current = _tracer
    if current is None:
        yield NO_SPAN
        return
    inherited = _scope.get()
    merged = {**inherited, **{k: v for k, v in (attributes or {}).items() if v is not None}}
    token = _scope.set({k: merged[k] for k in SCOPE if k in merged})
    try:
        with current.start_as_current_span(
            name, attributes=merged, record_exception=False, set_status_on_exception=False
        ) as opened:
            try:
                yield opened
            except ok as exc:
                opened.set_attribute("reef.outcome", type(exc).__name__)
                raise
            except Exception as exc:  # its type only: a message may quote a record
                from opentelemetry.trace import Status, StatusCode

                opened.set_status(Status(StatusCode.ERROR))
                opened.set_attribute("error.type", type(exc).__name__)
                raise
            except BaseException as exc:  # cancelled (shutdown): not the span's failure
                opened.set_attribute("reef.outcome", type(exc).__name__)
                raise
    finally:
        _scope.reset(token)


def batch_scope(scenario: str, recipe: str, batch_id: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The scope's attributes of a learner's batch, plus `extra`."""
    return {"reef.scenario": scenario, "reef.batch_id": batch_id, "reef.recipe": recipe, **(extra or {})}


def numeric(prefix: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The flat numbers (and short strings) of a metrics dict as span attributes under `prefix`;
    lists, dicts and None (per-task results, answers) are left out."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool) or isinstance(value, (int, float)):
            out[f"{prefix}{key}"] = value
        elif isinstance(value, str) and len(value) <= 200:
            out[f"{prefix}{key}"] = value
    return out
