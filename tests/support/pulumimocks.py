"""Pulumi's test mocks as the component tests use them: every resource is created with its inputs
as its outputs (id `<name>-id`), and every call answers nothing."""

from __future__ import annotations

from typing import Any

import pulumi


class EchoMocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None
