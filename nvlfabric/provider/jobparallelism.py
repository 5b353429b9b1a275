"""The size of an elastic BoundJob's Indexed Job (`max_parallelism`): a dynamic provider that sets
its `spec.parallelism` and `spec.completions` in place.

pulumi-kubernetes replaces a Job whose `parallelism` or `completions` changes (both are in its
list of fields that force a new object), although Kubernetes lets an Indexed Job change both
together while it runs (elastic Indexed Jobs, GA in 1.31): the pods past the new size are
removed, the missing indexes are created, the others keep running. So an elastic BoundJob's Job
resource ignores changes to those two fields (pulumi-kubernetes then sends their live values on
any other update) and this resource holds them: its update is a server-side apply of the two
fields under a field manager of its own, forced, so that it owns them from then on.

Its delete leaves the Job alone (the Job resource deletes the Job); a Job that is gone is an
error on create and update, and "gone" on read (refresh).
"""

from __future__ import annotations

from typing import Any, Final

from lightkube.resources.batch_v1 import Job
from lightkube.types import PatchType
from pulumi import ResourceOptions
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nvlfabric.api import errors as api_errors
from nvlfabric.api.names import DNS_LABEL, DNS_LABEL_MAX, DNS_SUBDOMAIN, DNS_SUBDOMAIN_MAX, MAX_PODS_PER_CLAIM
from nvlfabric.kube.errors import api_call
from nvlfabric.provider import errors, host, kube

FIELD_MANAGER: Final = "nvlfabric-job-size"
"""The field manager that owns an elastic Job's parallelism and completions once set here."""


class JobParallelismArgs(BaseModel):
    """Inputs of an elastic Job's size."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=DNS_SUBDOMAIN_MAX, description="the Job's name")
    namespace: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, description="the Job's namespace")
    parallelism: int = Field(ge=1, le=MAX_PODS_PER_CLAIM, description="pods running at once (and completions)")


def size_patch(args: JobParallelismArgs) -> dict[str, Any]:
    """The apply configuration of the two fields (pure)."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": args.name, "namespace": args.namespace},
            "spec": {"parallelism": args.parallelism, "completions": args.parallelism}}


host.install()  # in the dynamic provider host: our errors as their message, no traceback


class JobParallelismProvider(kube.KubeProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        try:
            _args(news)
        except ValidationError as exc:
            return CheckResult(news, [CheckFailure(".".join(str(p) for p in e["loc"]) or "(inputs)", str(e["msg"]))
                                      for e in exc.errors()])
        return CheckResult(news, [])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        moved = [k for k in ("name", "namespace") if olds.get(k) != news.get(k)]
        if moved:  # another Job: its own size (the old Job is being replaced or deleted by its resource)
            return DiffResult(changes=True, replaces=moved, delete_before_replace=False)
        return DiffResult(changes=olds.get("parallelism") != news.get("parallelism"))

    def create(self, props: dict[str, Any]) -> CreateResult:
        args = _args(props)
        return CreateResult(f"{args.namespace}/{args.name}", self._apply(args))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self._apply(_args(news)))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        args = _args(props)
        try:
            with api_call(f"read Job {args.namespace}/{args.name}"):
                job = self._client().get(Job, args.name, namespace=args.namespace)
        except api_errors.NotFound:
            return ReadResult(None, {})
        live = {**args.model_dump(), "parallelism": int(job.spec.parallelism or 0) if job.spec else 0}
        return ReadResult(id_, live, live)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing: the Job is its own resource's to delete, at whatever size it has."""

    def _apply(self, args: JobParallelismArgs) -> dict[str, Any]:
        where = f"Job {args.namespace}/{args.name}"
        try:
            with api_call(f"set the parallelism of {where} to {args.parallelism}"):
                self._client().patch(Job, args.name, size_patch(args), namespace=args.namespace,
                                     patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True)
        except api_errors.NotFound:
            raise errors.InvalidInputs(f"{where} does not exist: its BoundJob creates it before its size is set; "
                                       "`pulumi refresh` if it was deleted out of band") from None
        return args.model_dump()


def _args(props: dict[str, Any]) -> JobParallelismArgs:
    return JobParallelismArgs.model_validate({k: v for k, v in props.items() if k in JobParallelismArgs.model_fields})


class JobParallelism(Resource, module="nvlfabric", name="JobParallelism"):
    """The parallelism (and completions) of an elastic BoundJob's Indexed Job."""

    def __init__(self, resource_name: str, args: JobParallelismArgs, opts: ResourceOptions | None = None) -> None:
        super().__init__(JobParallelismProvider(), resource_name, args.model_dump(), opts)
