// A ComputeDomain of two nodes and a two-pod Job bound to it, declared with nvlfabric's components
// from TypeScript: the SDK's types check the arguments before Pulumi runs, and the provider checks
// them again (naming the property and the fix) for what types cannot say, e.g. GPUs per pod <= 4.
import * as pulumi from "@pulumi/pulumi";
import * as nvlfabric from "@pulumi/nvlfabric";

const config = new pulumi.Config();
const domain = config.get("domain") ?? "pretrain";

const pretrain = new nvlfabric.ComputeDomain("pretrain", {
    name: domain,
    spec: { numNodes: 2, imexMode: nvlfabric.IMEXMode.CliqueScoped },
});

const trainer = new nvlfabric.BoundJob("trainer", {
    computeDomain: pretrain,
    name: domain,
    parallelism: 2,
    gpusPerPod: config.getNumber("gpusPerPod") ?? 4,
    podTemplate: {
        spec: { containers: [{ name: "trainer", image: "registry.invalid/trainer:1" }] },
    },
});

export const claimName = pretrain.claimName;
export const namespace = pretrain.namespace;
export const job = trainer.jobName;
