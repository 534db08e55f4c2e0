"""The kubelet device-plugin API (v1beta1) and a test double of NVIDIA's device plugin (see __main__)."""
