"""One call to a Prometheus server's HTTP API (``/api/v1/query`` or ``/api/v1/query_range``),
shared by the usage source and the console's history."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def prometheus_query(url: str, path: str, params: dict[str, Any], result_type: str,
                     timeout: float) -> list[dict[str, Any]]:
    """The ``data.result`` list of ``GET url/path?params``; ValueError when Prometheus answers
    an error (with its own message) or a result of another type, OSError when it does not
    answer."""
    q = urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(f"{url}{path}?{q}", timeout=timeout) as r:
            body = json.loads(r.read(64 * 2**20))
    except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus' reason (a bad query)
        raise ValueError(f"{exc.code} {exc.read(300).decode(errors='replace')}") from exc
    if body.get("status") != "success" or body["data"]["resultType"] != result_type:
        raise ValueError(f"Prometheus answered {str(body)[:200]}")
    return list(body["data"]["result"])
