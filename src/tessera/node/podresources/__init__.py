"""The kubelet's pod-resources v1 gRPC API: which devices each container was given.

``api.proto`` is written from the documented API (k8s.io/kubelet/pkg/apis/podresources/v1); the
generated ``api_pb2*.py`` are committed (regenerate with ``python -m
tessera.node.podresources.generate``). :mod:`.client` is what the node agent uses.
"""
