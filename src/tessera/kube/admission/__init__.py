"""tessera's admission webhook: Run:ai / KAI and Alibaba cGPU spellings in, canonical out.

``python -m tessera.kube.admission`` (console script ``tessera-webhook``) serves ``/mutate``
and ``/validate`` (AdmissionReview v1) over TLS. See docs/admission.md.
"""
