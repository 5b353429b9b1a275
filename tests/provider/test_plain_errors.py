"""What the engine prints for our own errors from the dynamic provider: Pulumi's provider host
prints `traceback.format_exc()` of whatever a method raises, so an error raised deep in a call
chain (a missing namespace, seen as ~60 chained lines with the message last) must come out as a
few lines ending in its message."""

from __future__ import annotations

import traceback

import pytest

from nvlfabric.api import errors
from nvlfabric.provider.computedomain import ComputeDomainProvider
from nvlfabric.provider.host import plain_errors


def _deep(n: int) -> None:
    if n:
        _deep(n - 1)
    try:
        raise KeyError("the first thing that went wrong")
    except KeyError as exc:
        raise errors.NotFound(action="create ComputeDomain ml/train", code=404, reason="NotFound",
                              message="namespaces \"ml\" not found") from exc


def test_our_errors_reach_the_engine_as_a_few_lines_ending_in_the_message() -> None:
    with pytest.raises(errors.NotFound):  # the same error, for callers that tell errors apart
        plain_errors(_deep)(20)
    try:
        plain_errors(_deep)(20)
    except errors.NotFound:
        printed = traceback.format_exc()
    lines = printed.strip().splitlines()
    assert len(lines) <= 6, printed
    assert lines[-1].startswith("nvlfabric.api.errors.NotFound: create ComputeDomain ml/train"), lines[-1]
    assert 'namespaces "ml" not found' in lines[-1]
    assert "The above exception" not in printed and "KeyError" not in printed


def test_a_bug_keeps_its_whole_traceback() -> None:
    def buggy() -> None:
        raise ZeroDivisionError("a bug of ours")

    try:
        plain_errors(buggy)()
    except ZeroDivisionError:
        assert "in buggy" in traceback.format_exc()


def test_the_engine_entry_points_are_wrapped() -> None:
    for name in ("create", "read", "update", "delete"):
        assert getattr(ComputeDomainProvider, name).__wrapped__ is not None
