"""tessera-node's kubelet DRA plugin for driver gpu.tessera.io (docs/dra.md): the kubelet's
plugin-registration and DRAPlugin v1 gRPC services, the protocol files copied from
k8s.io/kubelet v0.36.3 (pkg/apis/dra/v1, pkg/apis/pluginregistration/v1)."""
