"""One line, not pages of tracebacks, when the engine stops a deployment at an error.

When a resource fails (a bad argument a component refused, a cluster that cannot be reached),
the Pulumi engine reports it and shuts its resource monitor down. Every registration of the
program still in flight then fails with gRPC status UNKNOWN "resource monitor shut down", which
the Python SDK (3.x) turns into a plain `Exception`: the language host prints it as "Program
failed with an unhandled exception" with a traceback through the SDK's internals, once per
pending resource, under the real error. The SDK already treats the same shutdown reported as
UNAVAILABLE as a `RunError` (one line, no traceback); this makes it treat this form the same.

Then the engine interrupts the program (SIGINT) while the SDK may still be unwinding, and
Python prints the `KeyboardInterrupt` with its traceback too. The program is meant to stop there,
so SIGINT ends it at once, output flushed and exit status 130, while Python's default handler is
the one in place. Not by `SystemExit`: unwinding the SDK's half-run coroutines then printed
tracebacks of their own ("Exception ignored in: <coroutine object run_in_stack>", "no running
event loop"), seen in CI.

Installed when `nvlfabric.components` is imported, for every resource of the program (the
user's own too): the noise is the SDK's, whoever's resource was in flight. Any other gRPC error
is converted exactly as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import grpc
from pulumi import RunError
from pulumi.runtime import settings
from pulumi.runtime.proto import engine_pb2_grpc

SHUT_DOWN = "resource monitor shut down"
STOPPED = ("the deployment stopped at the first error reported above; resources registered after it were not "
           "previewed or updated, and errors after it that say 'the client connection is closing' are that stop, "
           "not problems of their own")


def quiet(original: Callable[[Any], Exception]) -> Callable[[Any], Exception]:
    """`original`, the SDK's conversion of a gRPC error, with a shut-down resource monitor made a
    one-line `RunError` (`__wrapped__`: `original`, so that installing twice wraps once)."""

    def convert(exn: Any) -> Exception:
        try:
            shut = exn.code() == grpc.StatusCode.UNKNOWN and SHUT_DOWN in (exn.details() or "")
        except Exception:  # not a grpc.Call: leave it to the SDK
            shut = False
        return RunError(STOPPED) if shut else original(exn)

    convert.__wrapped__ = original  # type: ignore[attr-defined]
    return convert


def install() -> None:
    """Make the SDK report a shut-down resource monitor as a `RunError` (idempotent; a no-op
    where the SDK has no such hook, i.e. a version that handles it by itself), and SIGINT end a
    program the engine runs without a traceback."""
    original = getattr(settings, "grpc_error_to_exception", None)
    if callable(original) and not hasattr(original, "__wrapped__"):
        settings.grpc_error_to_exception = quiet(original)  # type: ignore[assignment]
    # Only in a program the Pulumi engine runs (not under tests' mocks, nor in a test runner that
    # reports Ctrl-C by its KeyboardInterrupt).
    if isinstance(settings.get_engine(), engine_pb2_grpc.EngineStub) and \
            threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def _interrupted(signum: int, _frame: Any) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signum)
