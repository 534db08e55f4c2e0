"""Property test against the served OpenAPI schema: any body gets 202, 409 or 422, never 500.

Bodies are drawn from the schema's own field list (``WorkloadCreate`` and its ``compute``), with
values of every JSON type, so the validators see well-typed nonsense as well as valid requests.
A 422 must name a field the schema has; a 202 must create exactly one workload.
"""

from __future__ import annotations

from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.testing.embedded import EmbeddedServer

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(["0.5", "1", "2", "5G", "4Gi", "100M", "0", "-1", "abc", "", "1e3", "0.001",
                     "portion", "memory", "V100-16GB", "H100-80GB|V100-16GB"]),
)


def _schema(server: EmbeddedServer) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{server.url}/openapi.json").json()
    return doc


def test_openapi_has_runai_shape(server: EmbeddedServer) -> None:
    doc = _schema(server)
    paths = doc["paths"]
    for path in ("/api/v1/token", "/api/v1/workloads", "/api/v1/workloads/{kind}",
                 "/api/v1/workloads/{kind}/{workloadId}",
                 "/api/v1/workloads/{kind}/{workloadId}/suspend",
                 "/api/v1/org-unit/projects", "/api/v1/org-unit/projects/{projectId}"):
        assert path in paths, path
    compute = doc["components"]["schemas"]["Compute"]["properties"]
    for field in ("gpuDevicesRequest", "gpuRequestType", "gpuPortionRequest", "gpuPortionLimit",
                  "gpuMemoryRequest", "gpuMemoryLimit"):
        assert field in compute


def test_random_bodies_never_crash_the_server(server: EmbeddedServer) -> None:
    doc = _schema(server)
    compute_fields = sorted(doc["components"]["schemas"]["Compute"]["properties"])
    spec_fields = sorted(doc["components"]["schemas"]["WorkloadSpec"]["properties"])
    with server.http() as c:
        c.post("/api/v1/org-unit/projects", json={"name": "prop", "resources": {"gpu": {
            "deserved": 100}}})
    counter = iter(range(10**6))

    compute_st = st.dictionaries(st.sampled_from(compute_fields), JSON_SCALARS, max_size=4)
    kinds = st.sampled_from(["trainings", "workspaces", "inferences"])

    @settings(max_examples=120, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(compute=compute_st, kind=kinds, name_ok=st.booleans(),
           extra=st.dictionaries(st.sampled_from(spec_fields), JSON_SCALARS, max_size=2))
    def check(compute: dict[str, Any], kind: str, name_ok: bool, extra: dict[str, Any]) -> None:
        name = f"p{next(counter)}" if name_ok else f"P_{next(counter)}"
        spec = {"command": "sleep", "args": "0", **extra, "compute": compute}
        body = {"name": name, "projectId": "prop", "spec": spec}
        with server.http() as c:
            before = c.get("/api/v1/workloads", params={"filterBy": "projectName==prop"}).json()
            r = c.post(f"/api/v1/workloads/{kind}", json=body)
            assert r.status_code in (202, 409, 422), (body, r.status_code, r.text)
            after = c.get("/api/v1/workloads", params={"filterBy": "projectName==prop"}).json()
            if r.status_code == 202:
                assert after["total"] == before["total"] + 1
                assert r.json()["name"] == name
            else:
                assert after["total"] == before["total"]
                message = r.json()["message"]
                field = message.split(":")[0]
                top = field.split(".")[0]
                assert top in ("name", "projectId", "spec", "body"), message
                if field.startswith("spec.compute."):
                    assert field.split(".")[2] in compute_fields, message

    check()
