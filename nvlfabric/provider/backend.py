"""The seam between the ComputeDomain provider and its backends.

`ComputeDomainProvider` (nvlfabric/provider/computedomain.py) answers the engine's calls for one
resource type whose `backend` input says whose object it is: nvlfabric's own ComputeDomain
(nvlfabric/provider/nvlfabricdomain.py) or NVIDIA's (nvlfabric/provider/nvidiadomain.py). Each
backend is a module that provides `DomainBackend`; the provider picks one by the inputs (or the
state) and hands it a `Context`. The backends never import each other, nor the provider: what
they share is in `domaininputs`, `domainclient`, `domainusers` and `await_`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from lightkube import Client
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult

from nvlfabric.api.errors import TemporaryError
from nvlfabric.kube import errors as kube_errors
from nvlfabric.provider import await_
from nvlfabric.provider.await_ import Condition, Deadline

T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    """What the provider gives a backend for one create, read, update or delete: the cluster's
    client (built on first use) and how to wait (the provider's clock, poll intervals and progress
    lines, which tests replace)."""

    connect: Callable[[], Client]
    clock: await_.Clock
    poll: await_.Poll
    on_progress: Callable[[str], None]
    #: Backend nvidia: how long a new domain may lack NVIDIA's finalizer before its controller is looked for.
    controller_grace_s: float

    def client(self) -> Client:
        return self.connect()

    def deadline(self, timeout_s: float) -> Deadline:
        """The one deadline of the call (started now)."""
        return Deadline.after(timeout_s, clock=self.clock)

    def retrying(self, deadline: Deadline, action: str, call: Callable[[], T]) -> T:
        """`call()` under `api_call(action)`, tried again after a temporary error (the API server
        unreachable, overloaded or failing) until the operation's deadline, as the await is. Tried
        once, an outage between the domain's create and its claim's failed the create, the roll-back
        could not reach the server either, and the domain left behind made every later `pulumi up`
        fail with ObjectExists. (A create whose answer was lost but which was applied still reads as
        AlreadyExists on the next try: for the claim that is fine, it is owned by the domain.)"""
        def attempt() -> T:
            with kube_errors.api_call(action):
                return call()

        return await_.retry(attempt, deadline=deadline, poll=self.poll, on_progress=self.on_progress)

    def wait(self, *, awaited: str, observe: Callable[[], T], condition: Condition[T], deadline: Deadline,
             hint: str = "", retried: tuple[type[Exception], ...] = (TemporaryError,)) -> T:
        """`await_.wait` at the provider's poll intervals, reporting progress to it."""
        return await_.wait(awaited=awaited, observe=observe, condition=condition, deadline=deadline,
                           poll=self.poll, on_progress=self.on_progress, hint=hint, retried=retried)


class DomainBackend(Protocol):
    """What a ComputeDomain backend provides: the engine's calls for its kind of object.

    `check_inputs` and `compute_diff` are pure (no cluster); the others get the call's `Context`.
    The module docstrings of the two backends say what each call does there.
    """

    def check_inputs(self, news: Mapping[str, Any]) -> CheckResult: ...

    def compute_diff(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> DiffResult: ...

    def create(self, ctx: Context, props: dict[str, Any]) -> CreateResult: ...

    def read(self, ctx: Context, id_: str, props: dict[str, Any]) -> ReadResult: ...

    def update(self, ctx: Context, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult: ...

    def delete(self, ctx: Context, id_: str, props: dict[str, Any]) -> None: ...
