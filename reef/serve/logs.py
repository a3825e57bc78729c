"""Reef's own log: configured once by `reef serve`, one line per request, never a secret or a body.

`configure(level, fmt)` sends every log record to stderr, as `text` (a timestamp, the level, the
logger, the message, then `key=value` fields) or `json` (one object per line). `reef.*` and
`uvicorn.*` log at the configured level; other libraries only from `warning` up, so a debug log
never carries a third party's request dump (an HTTP client's headers, with a provider key in
them).

Structured lines carry their fields in the `reef` attribute of the log record
(`log.info("request", extra={"reef": {...}})`); the formatter renders them, so nothing is
formatted unless a handler takes the line. What goes into fields is chosen where they are made:
ids, names, numbers; never a token, a key, a prompt or an answer.

`RequestLog` is the outermost ASGI layer: it writes the line of every HTTP request that the
inference path does not (a request refused before it was recorded: 400, 401, 404, 409, 413, ...;
`/reef/*` calls: POST at info, reads at debug). An inference request that stored a record is
logged by `InferenceService` when it ends, with its receipt, release and tokens.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_LOG = logging.getLogger("reef.request")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
OWN_LOGGERS = ("reef", "uvicorn")  # at the configured level; every other logger from warning up
_RECEIPT = b"x-reef-agent-record-id"
_QUIET_PATHS = frozenset({"/healthz", "/metrics"})  # probes and scrapes: debug, whatever the method


def configure(level: str = "info", fmt: str = "text", stream: Any = None) -> logging.Handler:
    """Route every log record to `stream` (stderr) in `fmt`; replaces handlers a previous call set."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.set_name("reef")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "reef"]:
        root.removeHandler(old)
    root.addHandler(handler)
    numeric = LEVELS[level]
    root.setLevel(max(numeric, logging.WARNING))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(numeric)
    logging.captureWarnings(True)  # a library's warnings become log lines (JSON ones in json)
    # no format prints threads or processes: do not look them up for every line
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    return handler


def emit(logger: logging.Logger, level: int, message: str, fields: dict[str, Any]) -> None:
    """A structured line, without the stack walk `logger.info` makes to find its caller (a
    request line's file and line are always the same). The caller checks the level first."""
    logger.handle(logger.makeRecord(logger.name, level, "", 0, message, (), None, extra={"reef": fields}))


def announcer(fmt: str, handler: logging.Handler) -> Callable[[str], None]:
    """What `reef serve` says as it starts (model conversion, where it listens): shown whatever
    the level, as `reef: ...` in text, as an info object in json."""
    if fmt != "json":
        return lambda line: print(f"reef: {line}", file=sys.stderr, flush=True)

    def say(line: str) -> None:
        handler.handle(
            logging.makeLogRecord({"name": "reef", "levelno": logging.INFO, "levelname": "INFO", "msg": line})
        )

    return say


def fields_of(record: logging.LogRecord) -> dict[str, Any] | None:
    return getattr(record, "reef", None)


_second: tuple[int, str] = (-1, "")  # the last second formatted: most lines share it


def _timestamp(record: logging.LogRecord) -> str:
    global _second
    whole = int(record.created)
    if _second[0] != whole:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{int(record.msecs):03d}Z"


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if not text or not text.isprintable() or any(c in text for c in ' "=\\'):
        return json.dumps(text)  # one line, quoted: a value never forges another field or line
    return text


class TextFormatter(logging.Formatter):
    """`2025-01-02T03:04:05.678Z INFO reef.request request receipt=... status=200 ...`"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name} {record.getMessage()}"
        fields = fields_of(record)
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts`, `level`, `logger`, `message`, then the record's fields
    (`exception` holds a traceback, newlines escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = fields_of(record)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class RequestLog:
    """Logs the HTTP requests nobody deeper logs: see the module's doc. Costs nothing when
    `reef.request` is above info (the level is read once per request, from logging's cache)."""

    def __init__(self, app: ASGIApp, hot: dict[str, Any] | None = None) -> None:
        self.app = app
        self.hot = hot or {}  # path -> (dialect, route) of the inference routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not REQUEST_LOG.isEnabledFor(logging.INFO if _loud(scope) else logging.DEBUG):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        recorded = False

        async def watch(message: Message) -> None:
            nonlocal status, recorded
            if message["type"] == "http.response.start":
                status = message["status"]
                recorded = any(name == _RECEIPT for name, _ in message.get("headers", ()))
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            status = status or 500  # answered by the error middleware outside
            raise
        finally:
            if not recorded:  # a recorded inference request has its own, richer line
                self._log(scope, status or 499, started)

    def _log(self, scope: Scope, status: int, started: float) -> None:
        path, method = scope["path"], scope["method"]
        hot = self.hot.get(path) if method == "POST" else None
        fields: dict[str, Any] = {
            "method": method,
            "path": path,
            "status": status,
            "latency_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        if hot is not None:  # refused before it was recorded: no receipt, no release
            scenario = next((v for k, v in scope["headers"] if k == b"x-reef-scenario"), b"default")
            fields = {
                "receipt": None,
                "scenario": scenario.decode("latin-1"),
                "release_id": None,
                "dialect": hot[0].name,
                "route": hot[1],
                **fields,
                "prompt_tokens": 0,
                "completion_tokens": 0,
            }
        level = logging.INFO if _loud(scope) else logging.DEBUG
        emit(REQUEST_LOG, level, "request" if hot is not None else "http", fields)


def _loud(scope: Scope) -> bool:
    """Inference and changes (POST, DELETE, ...) at info; reads, probes and scrapes at debug."""
    return scope.get("method") not in ("GET", "HEAD", "OPTIONS") and scope["path"] not in _QUIET_PATHS
