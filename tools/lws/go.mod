// Wrapper module: builds LeaderWorkerSet's controller manager (sigs.k8s.io/lws v0.7.0, its main
// package in cmd/) for the simulator's `--addons lws`. A module of its own: LWS builds on the
// Kubernetes 0.33 libraries, the control plane on 1.37.
module nvlfabric.io/tools/lws

go 1.26.0

require sigs.k8s.io/lws v0.7.0 // indirect
