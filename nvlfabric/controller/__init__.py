"""The cluster controller (`python -m nvlfabric controller`; of its replicas, only the Lease holder works: `leader`).

Publishes each clique's channel pool (`pools`), derives each ComputeDomain's summary status and
IMEX port slot (`reconcile`), and reserves shared channel claims for their pending pods
(`reservations`). It shares only `nvlfabric.api` with the node agent.
"""
