"""Our errors reach the engine as one line from Pulumi's dynamic provider host.

The host (`python -m pulumi.dynamic`, the process that runs every dynamic provider of a program)
wraps each call in `_abort_with_traceback`, which fails the gRPC call with
`traceback.format_exc()`: a missing namespace at `pulumi up` read as "error: Traceback (most
recent call last):" and four frames of the host and the provider, with the message last. The
message is the whole story for our own errors (`nvlfabric.api.errors.NvlfabricError`: it names
the object, what the API server said and the fix), so in that process the host's `traceback` is
given a `format_exc` that returns just the message for those, and the full traceback for any
other exception (another dynamic provider's, or a bug of ours: then the frames are wanted).

Installed when a provider module is imported; a no-op in any other process (the program's, a
test's), where `__main__` is not the dynamic provider host.

Also here, for the same host: `plain_errors`, which raises our errors afresh at a provider's entry
points (no chain, no frames below), and `progress`, the provider's lines to the CLI.
"""

from __future__ import annotations

import functools
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any, TypeVar

from nvlfabric.api.errors import NvlfabricError

F = TypeVar("F", bound=Callable[..., Any])


def format_exc(limit: int | None = None, chain: bool = True) -> str:
    """`traceback.format_exc`, except that an `NvlfabricError` being handled is its message alone."""
    exc = sys.exc_info()[1]
    if isinstance(exc, NvlfabricError):
        return str(exc)
    return traceback.format_exc(limit=limit, chain=chain)


def _shim() -> types.ModuleType:
    shim = types.ModuleType("traceback", "the host's traceback module, with nvlfabric's one-line errors")
    shim.__dict__.update({k: v for k, v in vars(traceback).items() if not k.startswith("__")})
    shim.format_exc = format_exc  # type: ignore[attr-defined]
    return shim


def install(main: Any = None) -> bool:
    """Give the dynamic provider host (`main`, default `sys.modules["__main__"]`) our
    `format_exc`; True when it was (or already is) installed there."""
    main = main if main is not None else sys.modules.get("__main__")
    if main is None or not callable(getattr(main, "_abort_with_traceback", None)):
        return False
    current = getattr(main, "traceback", None)
    if getattr(current, "format_exc", None) is not format_exc:
        main.traceback = _shim()
    return True


def plain_errors(method: F) -> F:
    """Our own errors reach the engine as their message: Pulumi's dynamic provider host prints the
    whole traceback of whatever a method raises (a missing namespace was ~60 chained lines with the
    message last), so the error is raised afresh here, without its chain or the frames below."""
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except NvlfabricError as exc:
            error = exc
        raise error.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]


def progress(message: str) -> None:
    """A progress line of a dynamic provider, for the CLI."""
    # pulumi.log is not connected inside dynamic providers; their stderr reaches the CLI.
    print(f"nvlfabric: {message}", file=sys.stderr, flush=True)
