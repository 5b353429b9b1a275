"""The kubelet's gRPC contracts (plugin registration, DRA v1/v1beta1, device health).

A leaf package shared by both sides of the wire: the node agent serves these services and the
simulated kubelet calls them. The .proto files are ours, written from the kubelet-plugin
reference's field tables; the *_pb2 modules are generated from them by `make generate`
(grpcio-tools) and checked in, and a test fails when they are stale.
"""
