"""tessera-node: the node agent (GPU inventory, pod-resources, isolation files, metrics).

One component for both modes: the chart's DaemonSet on Kubernetes and, in embedded mode, the
same inventory and metrics code inside ``tessera up``. docs/node-agent.md describes it.
"""
