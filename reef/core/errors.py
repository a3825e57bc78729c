"""The exception tree every step of Reef shares.

    ReefError
    ├── InvalidInput        bad input from a caller; nothing was changed         (HTTP 400)
    ├── NotFound            unknown receipt, scenario or release                 (HTTP 404)
    │   └── MissingArtifact a release the commit log names has no artifact
    ├── Conflict            a binding contradiction or a stale compare-and-swap  (HTTP 409)
    │   ├── RecordConflict  same record or report id, other content
    │   └── StaleHead       head, parent or step moved under the caller
    ├── Corruption          durable state is damaged; names the file and line
    ├── StorageUnavailable  the store cannot take writes now (disk full, closed)  (HTTP 503)
    ├── PayloadTooLarge     a request body over the configured limit              (HTTP 413)
    ├── Forbidden           refused by the server's settings (a limit reached)    (HTTP 403)
    ├── Unauthorized        no token or a wrong one                               (HTTP 401)
    └── RuntimeFailure      the model runtime or upstream provider failed        (HTTP 502, or
                            the provider's own 4xx status, relayed)

Callers catch the branch they mean; the HTTP layer maps branches to status codes.
"""

from __future__ import annotations


class ReefError(Exception):
    """Base of every error Reef raises on purpose. `headers` go out with its HTTP answer (a
    receipt naming the record it stored, a provider's `Retry-After`)."""

    kind = "reef_error"
    headers: dict[str, str] = {}

    def with_headers(self, headers: dict[str, str]) -> ReefError:
        self.headers = {**self.headers, **headers}
        return self


class InvalidInput(ReefError, ValueError):
    kind = "invalid_request_error"


class NotFound(ReefError, LookupError):
    kind = "not_found_error"


class MissingArtifact(NotFound):
    kind = "missing_artifact_error"


class Conflict(ReefError):
    kind = "conflict_error"


class RecordConflict(Conflict):
    kind = "record_conflict_error"


class StaleHead(Conflict):
    kind = "stale_head_error"


class Corruption(ReefError):
    """Durable state is damaged somewhere other than a torn last line."""

    kind = "corruption_error"

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class StorageUnavailable(ReefError):
    kind = "storage_unavailable_error"


class PayloadTooLarge(ReefError):
    kind = "request_too_large"


class Forbidden(ReefError):
    """Well-formed, but the server's settings refuse it (e.g. `limits.max_scenarios` reached);
    a retry gets the same answer until the setting changes."""

    kind = "permission_error"


class Unauthorized(ReefError):
    kind = "authentication_error"


class RuntimeFailure(ReefError):
    """The runtime could not answer. `status` is what the client gets: a provider's own 4xx is
    relayed (the client sent something the provider refuses), anything else is 502."""

    kind = "upstream_error"

    def __init__(self, message: str, status: int = 502, error_type: str = "upstream_error") -> None:
        super().__init__(message)
        self.status = status if 400 <= status < 500 else 502
        self.error_type = error_type
