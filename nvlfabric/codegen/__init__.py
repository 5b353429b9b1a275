"""Generators of checked-in files, run by hand or by `make generate`, never at run time: the
ComputeDomain CRD from the contract's models (`crdgen`) and the gRPC stubs from the .proto files
(`grpcstubs`). Tests check the generated files are current."""
