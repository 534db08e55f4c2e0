"""What a failure of the Kubernetes API server means to a client of tessera's REST API.

Any call the Kubernetes backend makes can meet an API server that is starting, unreachable,
missing tessera's CRDs or refusing the ServiceAccount; a route that did not expect it would
otherwise answer 500 "internal error". :func:`explain` turns such an error into one line a
person can act on (the API answers it as 502 Bad Gateway)."""

from __future__ import annotations

import httpx
import httpx2
from lightkube import ApiError

from tessera.api.backend import Upstream

# lightkube 1.x speaks through httpx2 (httpx's API under another name); both are caught.
_TRANSPORT_ERRORS = (httpx.HTTPError, httpx2.HTTPError, ConnectionError, TimeoutError)

_CRD_HINT = ("tessera's CRDs are not installed: kubectl apply -f deploy/crds/ "
             "(the Helm chart installs them)")


def explain(exc: Exception, server: str) -> Upstream | None:
    """An Upstream error for failures of the API server or of reaching it; None otherwise."""
    if isinstance(exc, ApiError):
        return Upstream(_api_error(exc))
    if isinstance(exc, httpx.HTTPStatusError | httpx2.HTTPStatusError):
        return Upstream(_status_error(exc.response.status_code, exc.request.url.path))
    if isinstance(exc, _TRANSPORT_ERRORS):
        return Upstream(f"cannot reach the Kubernetes API server at {server}: "
                        f"{type(exc).__name__}: {exc}")
    return None


def _api_error(exc: ApiError) -> str:
    status = exc.status
    code = int(getattr(status, "code", 0) or 0)
    message = str(getattr(status, "message", "") or exc)
    details = getattr(status, "details", None)
    group = str(getattr(details, "group", "") or "")
    kind = str(getattr(details, "kind", "") or "")
    what = f"{kind}.{group}" if kind and group else (kind or group)
    if code == 404 and ("tessera.io" in group or "could not find the requested resource" in message):
        return f"the Kubernetes API server has no {what or 'such resource type'}: {_CRD_HINT}"
    if code == 403:
        return (f"the Kubernetes API server refused tessera-api's ServiceAccount: {message} "
                "(its role: deploy/api-rbac.yaml, or the chart's api role)")
    if code in (429, 503) or "initializing" in message:
        return (f"the Kubernetes API server is busy or starting ({code}: {message}); "
                "try again in a few seconds")
    return f"the Kubernetes API server answered {code}: {message}"


def _status_error(code: int, path: str) -> str:
    if code == 404 and "/apis/tessera.io/" in path:
        return f"the Kubernetes API server has no {path.split('/')[-1]}.tessera.io: {_CRD_HINT}"
    if code == 403:
        return (f"the Kubernetes API server refused tessera-api's ServiceAccount {path} "
                "(its role: deploy/api-rbac.yaml, or the chart's api role)")
    if code in (429, 503):
        return f"the Kubernetes API server is busy or starting ({code}); try again in a few seconds"
    return f"the Kubernetes API server answered {code} for {path}"
