"""Embedded mode: the control plane on one machine, without Kubernetes.

``store`` keeps projects and workloads in SQLite, ``gpus`` finds the devices (or simulates them),
``runner`` runs workloads as process groups, ``scheduling`` turns them into the core's types for its cycle and
``control`` is the loop that joins them; ``server`` serves it all over the REST API.
"""
