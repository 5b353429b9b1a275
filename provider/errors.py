"""The errors nvlfabric's providers raise: one hierarchy for the boundary to the Kubernetes API.

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
`AwaitFailed`, which say what was awaited and what was last seen (see `provider.await_`).

Every API error is chained (`raise ... from exc`) to the client's exception, so the transport
detail stays available to a debugger, while the message shown to the user holds only the Status
message and causes, each cut to `MAX_PAYLOAD` characters: a response body can echo what was sent,
and what was sent may be sensitive (a kubeconfig, a token in an annotation). Bodies that are not a
`Status` (an HTML error page from a proxy, say) are dropped, not shown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import httpx2
from lightkube import ApiError

#: Longest Status message or cause text carried into an error message.
MAX_PAYLOAD: Final = 256


def truncate(text: str, limit: int = MAX_PAYLOAD) -> str:
    """`text` cut to at most `limit` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ProviderError(Exception):
    """Base of every error nvlfabric's providers raise on purpose."""


class PermanentError(ProviderError):
    """Retrying the same request will fail the same way; the message says what to change."""


class TemporaryError(ProviderError):
    """The request may succeed if tried again, after `delay_s` seconds when that is known."""

    delay_s: float | None = None


# -- API statuses ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cause:
    """One `StatusCause`: which field was wrong and why (both truncated)."""

    field: str
    message: str
    reason: str = ""


class ApiStatusError(ProviderError):
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


def _error_class(code: int, reason: str) -> type[ApiStatusError]:
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists
    if reason in ("Timeout", "ServerTimeout"):
        return Timeout
    if code in _BY_CODE:
        return _BY_CODE[code]
    # Other 4xx are the request's fault; 5xx and a missing code are the server's.
    return BadRequest if 400 <= code < 500 else ServerError


def from_api_error(exc: ApiError, *, action: str) -> ApiStatusError:
    """The error class for a lightkube `ApiError` (a Status answer); the caller chains it with `from`."""
    status = exc.status
    code = int(status.code or (exc.response.status_code if exc.response is not None else 0))
    reason = status.reason or ""
    details = status.details
    causes = [Cause(field=c.field or "", message=truncate(c.message or ""), reason=c.reason or "")
              for c in (details.causes or [] if details else [])]
    delay = float(details.retryAfterSeconds) if details and details.retryAfterSeconds else None
    return _error_class(code, reason)(action=action, code=code, reason=reason, message=status.message or "",
                                      causes=causes, delay_s=delay)


def translate(exc: Exception, *, action: str) -> ProviderError:
    """The `ProviderError` for an exception from the Kubernetes client (others are returned wrapped as-is).

    A non-Status HTTP error keeps only its code: the body is not shown.
    """
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ApiError):
        return from_api_error(exc, action=action)
    if isinstance(exc, httpx2.HTTPStatusError):
        code = exc.response.status_code
        return _error_class(code, "")(action=action, code=code, reason=exc.response.reason_phrase,
                                      message="the server's answer was not a Kubernetes Status (body not shown)")
    if isinstance(exc, httpx2.TransportError):
        return Unreachable(f"{action}: the API server could not be reached: {truncate(str(exc) or type(exc).__name__)}")
    return ProviderError(f"{action}: {truncate(str(exc) or type(exc).__name__)}")


@contextlib.contextmanager
def api_call(action: str) -> Iterator[None]:
    """Translate what the client raises inside the block into our hierarchy, chained with `from`.

    `action` names the request and its object, e.g. "create ComputeDomain ml/train", and leads the
    message.
    """
    try:
        yield
    except (ApiError, httpx2.HTTPError) as exc:
        raise translate(exc, action=action) from exc


# -- our own decisions -----------------------------------------------------------------------------


class ObjectExists(PermanentError):
    """Create refused to take over an object it did not create; the message lists the remedies."""


class InvalidInputs(PermanentError):
    """A resource's inputs do not validate (normally `check` reports this before anything runs)."""


class InUse(PermanentError):
    """Delete refused: workloads still use the object; the message names them and the fix."""


class AwaitError(ProviderError):
    """Waiting for an object ended without the awaited state.

    `awaited` says what was waited for ("ComputeDomain ml/train to be Ready"), `seen` what was last
    observed ("1 of 2 nodes ready; node n2: IMEX daemon not ready"); `last` is that observation.
    """

    def __init__(self, message: str, *, awaited: str, seen: str, last: object = None) -> None:
        super().__init__(message)
        self.awaited = awaited
        self.seen = seen
        self.last = last


class AwaitTimeout(AwaitError):
    """The deadline passed before the awaited state was seen."""

    def __init__(self, *, awaited: str, seen: str, timeout_s: float, last: object = None, hint: str = "") -> None:
        self.timeout_s = timeout_s
        message = f"timed out after {format_seconds(timeout_s)} waiting for {awaited}: {seen}"
        super().__init__(message + (f" ({hint})" if hint else ""), awaited=awaited, seen=seen, last=last)


class AwaitFailed(AwaitError, PermanentError):
    """The object reached a state from which the awaited one cannot follow (e.g. phase Failed)."""

    def __init__(self, *, awaited: str, seen: str, last: object = None) -> None:
        super().__init__(f"gave up waiting for {awaited}: {seen}", awaited=awaited, seen=seen, last=last)


def format_seconds(seconds: float) -> str:
    """30 -> '30s', 1.5 -> '1.5s', 0.25 -> '0.25s'."""
    return f"{seconds:g}s"
