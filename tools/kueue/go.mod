// Wrapper module: builds Kueue's controller manager (sigs.k8s.io/kueue v0.14.0, its main package in
// cmd/kueue) for the simulator's `--addons kueue`. A module of its own: Kueue builds on the
// Kubernetes 0.34 libraries, the control plane on 1.37.
module nvlfabric.io/tools/kueue

go 1.26.0

require sigs.k8s.io/kueue v0.14.0 // indirect
