"""tessera as a Kubernetes scheduler: watches, snapshot, the core cycle, and applying its plan.

``python -m tessera.kube.scheduler --kubeconfig PATH`` (console script ``tessera-scheduler``).
See docs/kubernetes.md.
"""
