"""The harness around the simulator: bring up a local control plane with simulated racks
(`controlplane`) and run the real Pulumi CLI against it (`pulumi_cli`). Used by `nvlfabric-sim`,
`make demo`, the tests and the benchmarks; production rooms never import it."""
