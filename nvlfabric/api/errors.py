"""Errors at the boundary to the Kubernetes API: one hierarchy that every client of ours raises through.

The providers and the controller (lightkube, translated by `nvlfabric.kube.errors`) and the node
agent (its own small client, `nvlfabric.nodeagent.kubeapi`) raise these same classes, so every room
matches errors by type, never by a status code or a string.

Callers never match strings; they match types. Two axes:

- **What happened**, chosen from the API server's `Status` (code, then reason): `BadRequest` (400),
  `Unauthorized` (401), `Forbidden` (403), `NotFound` (404), `AlreadyExists` (409, reason
  AlreadyExists), `Conflict` (409, any other reason: a stale resourceVersion), `Gone` (410),
  `Invalid` (422, with the offending fields as `causes`), `TooManyRequests` (429), `ServerError`
  (5xx) and its `Timeout` (504, or reason Timeout/ServerTimeout); `Unreachable` when no response
  came back at all.
- **Whether retrying can help** (the retry policy is the type, never the text): `PermanentError`
  (the request as made will keep failing; the user must change something) or `TemporaryError`
  (try again, after `delay_s` when the server said how long).

Our own decisions about objects are errors too: `ObjectExists` (create refuses to take over),
`InUse` (delete refuses while pods use the channel claim), and the await errors `AwaitTimeout` and
`AwaitFailed`, which say what was awaited and what was last seen (see `nvlfabric.provider.await_`).

Every API error is chained (`raise ... from exc`) to the client's exception, so the transport
detail stays available to a debugger, while the message shown to the user holds only the Status
message and causes, each cut to `MAX_PAYLOAD` characters: a response body can echo what was sent,
and what was sent may be sensitive (a kubeconfig, a token in an annotation). Bodies that are not a
`Status` (an HTML error page from a proxy, say) are dropped, not shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

#: Longest Status message or cause text carried into an error message.
MAX_PAYLOAD: Final = 256


def truncate(text: str, limit: int = MAX_PAYLOAD) -> str:
    """`text` cut to at most `limit` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class NvlfabricError(Exception):
    """Base of every error nvlfabric raises on purpose."""


class PermanentError(NvlfabricError):
    """Retrying the same request will fail the same way; the message says what to change."""


class TemporaryError(NvlfabricError):
    """The request may succeed if tried again, after `delay_s` seconds when that is known."""

    delay_s: float | None = None


# -- API statuses ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cause:
    """One `StatusCause`: which field was wrong and why (both truncated)."""

    field: str
    message: str
    reason: str = ""


class ApiStatusError(NvlfabricError):
    """The API server answered a request (`action`) with an error Status."""

    def __init__(self, *, action: str, code: int, reason: str, message: str,
                 causes: Sequence[Cause] = (), delay_s: float | None = None, hint: str = "") -> None:
        self.action = action
        self.hint = hint
        self.code = code
        self.reason = reason
        self.message = truncate(message)
        self.causes = tuple(causes)
        self.delay_s = delay_s
        super().__init__(self._render())

    @property
    def fields(self) -> list[str]:
        """The fields the server named as wrong, in its order."""
        return [c.field for c in self.causes if c.field]

    def _render(self) -> str:
        text = f"{self.action}: {self.message or self.reason or 'no message'} ({self.code} {self.reason})".rstrip()
        if self.fields:
            text += f"; fields: {', '.join(self.fields)}"
        return f"{text}; {self.hint}" if self.hint else text


class BadRequest(ApiStatusError, PermanentError):
    """400: malformed request, or (with strict field validation) an unknown or duplicate field."""


class Unauthorized(ApiStatusError, PermanentError):
    """401: the kubeconfig's credentials were not accepted."""


class Forbidden(ApiStatusError, PermanentError):
    """403: authenticated, but RBAC (or an admission policy) does not allow this request."""


class NotFound(ApiStatusError, PermanentError):
    """404: the object (or its whole API, when a CRD is not installed) does not exist."""


class AlreadyExists(ApiStatusError, PermanentError):
    """409 AlreadyExists: an object of that name exists."""


class Conflict(ApiStatusError, TemporaryError):
    """409 Conflict: the object changed since it was read; read it again and retry."""


class Gone(ApiStatusError, TemporaryError):
    """410: a resourceVersion too old to serve; list again."""


class Invalid(ApiStatusError, PermanentError):
    """422: the object failed validation (schema, CEL rules, immutability); `causes` name the fields."""


class TooManyRequests(ApiStatusError, TemporaryError):
    """429: throttled (API priority and fairness); `delay_s` is the server's Retry-After."""


class ServerError(ApiStatusError, TemporaryError):
    """5xx: the API server (or something behind it: etcd, a webhook) failed."""


class Timeout(ServerError):
    """504, or reason Timeout/ServerTimeout: the server gave up on the request in time."""


class Unreachable(TemporaryError):
    """No HTTP response: connection refused or reset, TLS failure, client-side timeout."""


_BY_CODE: Final[dict[int, type[ApiStatusError]]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone,
    422: Invalid, 429: TooManyRequests, 504: Timeout,
}


def error_class(code: int, reason: str) -> type[ApiStatusError]:
    """The class for an HTTP status code and a Status reason."""
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists
    if reason in ("Timeout", "ServerTimeout"):
        return Timeout
    if code in _BY_CODE:
        return _BY_CODE[code]
    # Other 4xx are the request's fault; 5xx and a missing code are the server's.
    return BadRequest if 400 <= code < 500 else ServerError


def from_status(status: Mapping[str, Any], *, action: str, code: int = 0) -> ApiStatusError:
    """The error for a `Status` object (as JSON) the API server answered with; `code` is the HTTP
    status when the Status carries none. The caller chains it to the client's exception with `from`."""
    code = int(status.get("code") or code or 0)
    reason = str(status.get("reason") or "")
    details = status.get("details") or {}
    causes = [Cause(field=str(c.get("field") or ""), message=truncate(str(c.get("message") or "")),
                    reason=str(c.get("reason") or "")) for c in details.get("causes") or []]
    retry = details.get("retryAfterSeconds")
    return error_class(code, reason)(action=action, code=code, reason=reason, message=str(status.get("message") or ""),
                                      causes=causes, delay_s=float(retry) if retry else None)


def not_a_status(*, action: str, code: int, reason: str) -> ApiStatusError:
    """The error for an HTTP error whose body is not a Kubernetes Status (a proxy's HTML page, say):
    only its code is kept; the body is not shown."""
    return error_class(code, "")(action=action, code=code, reason=reason,
                                  message="the server's answer was not a Kubernetes Status (body not shown)")
