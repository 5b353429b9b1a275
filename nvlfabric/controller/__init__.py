"""The cluster controller (`python -m nvlfabric controller`; of its replicas, only the Lease holder works: `leader`).

Publishes each clique's channel pool (`pools`), derives each ComputeDomain's summary status and
IMEX port slot (`reconcile`), reserves shared channel claims for their pending pods and places
them (`reservations`, `placer`), and answers Kueue's admission checks (`admission`); `wiring`
builds and starts these parts on one set of informers (`cache`). It shares only `nvlfabric.api`
with the node agent.
"""
