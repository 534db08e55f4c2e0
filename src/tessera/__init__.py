"""tessera: fractional GPU sharing for Kubernetes and single machines."""

__version__ = "0.1.0"
