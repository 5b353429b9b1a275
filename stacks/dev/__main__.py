"""The dev stack: what nvlfabric declares on the local simulator.

For now: the driver's namespace (pulumi-kubernetes) and the IMEX channel DeviceClass (our dynamic
provider), which together prove the offline engine, both plugins and the control plane.
"""

import pulumi
import pulumi_kubernetes as k8s

from provider.deviceclass import DeviceClass, DeviceClassArgs

config = pulumi.Config()
namespace = k8s.core.v1.Namespace(
    "nvlfabric-system",
    metadata=k8s.meta.v1.ObjectMetaArgs(
        name=config.get("namespace") or "nvlfabric-system",
        labels={"app.kubernetes.io/part-of": "nvlfabric"},
    ),
)
channels = DeviceClass(
    "imex-channel",
    DeviceClassArgs(
        name="imex-channel.nvlfabric.io",
        selectors=['device.driver == "channel.nvlfabric.io"'],
        labels={"app.kubernetes.io/part-of": "nvlfabric"},
    ),
)

pulumi.export("namespace", namespace.metadata.name)
pulumi.export("channel_device_class", channels.id)
