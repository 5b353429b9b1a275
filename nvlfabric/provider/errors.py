"""The providers' own decisions about objects, as errors on the bases of `nvlfabric.api.errors`.

`ObjectExists` (create refuses to take over), `InvalidInputs`, `InUse` (delete refuses while pods
use the channel claim), and the await errors `AwaitTimeout` and `AwaitFailed`, which say what was
awaited and what was last seen (see `nvlfabric.provider.await_`). API errors themselves are
`nvlfabric.api.errors`; lightkube's are translated into them by `nvlfabric.kube.errors`.
"""

from __future__ import annotations

from nvlfabric.api.errors import NvlfabricError, PermanentError


class ObjectExists(PermanentError):
    """Create refused to take over an object it did not create; the message lists the remedies."""


class InvalidInputs(PermanentError):
    """A resource's inputs do not validate (normally `check` reports this before anything runs)."""


class ClaimDeleting(PermanentError):
    """A domain's channel claim was deleted out of band and is held by pods: it cannot be made anew yet."""


class InUse(PermanentError):
    """Delete refused: workloads still use the object; the message names them and the fix."""


class AwaitError(NvlfabricError):
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
