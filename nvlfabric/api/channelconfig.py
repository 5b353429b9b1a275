"""The opaque device configuration a ComputeDomain's channel claim carries for our DRA driver.

Written by the provider into the claim (`spec.devices.config[].opaque`, driver
`channel.nvlfabric.io`), read back by the node agent from the allocation. The agent decodes it
strictly: an unknown field is a permanent, named error, not something to guess about.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nvlfabric.api.computedomain import API_VERSION, ChannelAllocationMode, IMEXMode


class ComputeDomainRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    uid: str = Field(min_length=1)


class ChannelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["nvlfabric.io/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["ChannelConfig"] = "ChannelConfig"
    compute_domain: ComputeDomainRef = Field(alias="computeDomain")
    imex_mode: IMEXMode = Field(IMEXMode.CLIQUE_SCOPED, alias="imexMode")
    channel_allocation_mode: ChannelAllocationMode = Field(ChannelAllocationMode.SINGLE,
                                                           alias="channelAllocationMode")

    def to_kube(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)
