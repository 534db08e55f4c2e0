from __future__ import annotations

from collections.abc import Iterator

import pytest

from tessera.testing.embedded import EmbeddedServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("robust"), simulate=["2xV100-16GB"])
    s.start()
    try:
        yield s
    finally:
        s.cleanup()
