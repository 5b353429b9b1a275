"""lightkube, as the providers, the controller and the simulator use it: client construction and
its errors translated into `nvlfabric.api.errors`.

The node agent does not use this room (its own small client, `nvlfabric.nodeagent.kubeapi`, fits its
memory budget); both raise the same error classes.
"""
