"""What nvlfabric's long-running processes (the node agent, the IMEX keeper, the controller) share:
how they log and stop (`process`) and how they serve Prometheus metrics (`metrics`).

Standard library only, with the contract below it: the IMEX keeper runs on every node and carries
neither pydantic nor gRPC (an import-linter contract)."""
