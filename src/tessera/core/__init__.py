"""The pure core of tessera: model, units, placement, fair share and the scheduling cycle.

Nothing here does I/O; adapters (local, kube, api, cli, node, bench) import the core, never
the other way round.
"""
