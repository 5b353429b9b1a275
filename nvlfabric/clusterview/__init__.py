"""What the cluster says now, read at program time: a rack's nodes (`racks`), whether an API is
served (`discovery`) and whether Kubernetes can schedule a workload itself (`scheduling`).

Plain reads with lightkube, no Pulumi resource: the components (preview and up alike) and the
cluster review use them. They were in `provider/`, but nothing here is a provider and nothing here
is pickled into a stack's state (only `provider`'s dynamic providers are, by module path)."""
