"""The REST API, shaped like Run:ai's, in front of a backend (local now, Kubernetes later)."""
