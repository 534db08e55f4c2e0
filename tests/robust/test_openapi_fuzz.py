"""schemathesis over every route of the served ``/openapi.json`` (issue 14), against a real
embedded server: valid and invalid bodies, paths and queries generated from the schema. No
request may get a 5xx; every 4xx is the API's error shape with a message saying what was
wrong (a 422 names the field). The budget is bounded (examples per route), so the suite stays
short; run with ``TESSERA_FUZZ_EXAMPLES=500`` for a longer search."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from tessera.testing.embedded import EmbeddedServer, submit_body

EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "30"))


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("fuzz"), simulate=["2xV100-16GB"])
    s.start()
    with s.http() as c:  # something for the routes with ids to find
        c.post("/api/v1/org-unit/projects", json={"name": "fuzz", "resources": {"gpu": {
            "deserved": 1}}}).raise_for_status()
        c.post("/api/v1/workloads/trainings", json=submit_body(
            "fuzz-w", "fuzz", gpuPortionRequest=0.1)).raise_for_status()
    try:
        yield s
    finally:
        s.cleanup()


def _operations(server: EmbeddedServer) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    return [r.ok() for r in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_input_gets_a_server_error(fuzz_server: EmbeddedServer, mode: GenerationMode) -> None:
    """Every operation of the schema, ``EXAMPLES`` generated requests each (valid ones, and
    ones that break the schema)."""
    operations = _operations(fuzz_server)
    assert len(operations) >= 15
    token = fuzz_server.token()
    seen: Counter[int] = Counter()
    for op in operations:
        _fuzz(op, mode, fuzz_server, token, seen)
    assert sum(seen.values()) >= len(operations)


def _fuzz(op: Any, mode: GenerationMode, fuzz_server: EmbeddedServer, token: str,
          seen: Counter[int]) -> None:
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            if op.path == "/api/v1/token" and op.method.upper() == "DELETE":
                headers = {}  # never revoke the fuzzer's own token
            response = case.call(base_url=fuzz_server.url, headers=headers, timeout=30)
            seen[response.status_code] += 1
            assert response.status_code < 500, (op.label, response.text[:500])
            if 400 <= response.status_code < 500 and response.status_code != 405:
                body = response.json()
                assert body["code"] == response.status_code and body["message"], body
                if response.status_code == 422:
                    assert ": " in body["message"], body  # FIELD: rule

        try:
            check()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # nothing to break (no parameters, no body)
