"""lightkube's exceptions as `nvlfabric.api.errors`: the one hierarchy every room matches by type.

Every error is chained (`raise ... from exc`) to the client's exception, so the transport detail
stays available to a debugger, while the message shows only the Status message and causes, cut to
`errors.MAX_PAYLOAD` characters. A body that is not a `Status` is dropped, not shown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx2
from lightkube import ApiError

from nvlfabric.api import errors


def from_api_error(exc: ApiError, *, action: str) -> errors.ApiStatusError:
    """The error class for a lightkube `ApiError` (a Status answer); the caller chains it with `from`."""
    code = exc.response.status_code if exc.response is not None else 0
    return errors.from_status(exc.status.to_dict(), action=action, code=code)


def translate(exc: Exception, *, action: str) -> errors.NvlfabricError:
    """The `NvlfabricError` for an exception from lightkube (others are returned wrapped as-is)."""
    if isinstance(exc, errors.NvlfabricError):
        return exc
    if isinstance(exc, ApiError):
        return from_api_error(exc, action=action)
    if isinstance(exc, httpx2.HTTPStatusError):
        status = _status_body(exc.response)
        if status is not None:
            return errors.from_status(status, action=action, code=exc.response.status_code)
        return errors.not_a_status(action=action, code=exc.response.status_code, reason=exc.response.reason_phrase)
    if isinstance(exc, httpx2.TransportError):
        return errors.Unreachable(
            f"{action}: the API server could not be reached: {errors.truncate(str(exc) or type(exc).__name__)}")
    return errors.NvlfabricError(f"{action}: {errors.truncate(str(exc) or type(exc).__name__)}")


def _status_body(resp: httpx2.Response) -> dict[str, Any] | None:
    """The `Status` an error answer carries, or None. Read first: lightkube's watch raises httpx's
    own error for a refused watch without reading the streamed body, and that body holds what the
    user needs (for a 403, which identity may not do what)."""
    try:
        resp.read()
        body = resp.json()
    except (httpx2.HTTPError, httpx2.StreamError, ValueError):
        return None
    return body if isinstance(body, dict) and body.get("kind") == "Status" else None


@contextlib.contextmanager
def api_call(action: str) -> Iterator[None]:
    """Translate what lightkube raises inside the block into `nvlfabric.api.errors`, chained with `from`.

    `action` names the request and its object, e.g. "create ComputeDomain ml/train", and leads the
    message.
    """
    try:
        yield
    except (ApiError, httpx2.HTTPError) as exc:
        raise translate(exc, action=action) from exc
