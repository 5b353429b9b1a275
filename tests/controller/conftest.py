"""Fixtures the controller's cluster tests share."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import CELDeviceSelector, DeviceClassSpec, DeviceSelector
from lightkube.resources.resource_v1 import DeviceClass

from nvlfabric.api.names import FABRIC_READY_LABEL
from nvlfabric.controller import pools
from nvlfabric.sim.cluster import delete_nodes, install_crd, make_ready_nodes
from tests.conftest import Cluster


@pytest.fixture
def clique_nodes(cluster: Cluster) -> Iterator[tuple[str, list[str]]]:
    cluster_uuid = uuid.uuid4()
    run = cluster_uuid.hex[:5]
    clique = f"{cluster_uuid}.32766"
    names = [f"ctl-{run}-{i}" for i in range(2)]
    install_crd(cluster.client)
    make_ready_nodes(cluster.client, {n: {pools.CLIQUE_LABEL: clique, "ctl-test": run,
                                          FABRIC_READY_LABEL: "true"} for n in names})
    with contextlib.suppress(ApiError):
        cluster.client.create(DeviceClass(metadata=ObjectMeta(name="imex-channel.nvlfabric.io"), spec=DeviceClassSpec(
            selectors=[DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{pools.DRIVER}"'))])))
    yield clique, names
    delete_nodes(cluster.client, names)
    pools.withdraw(cluster.client, clique)
