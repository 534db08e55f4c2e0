"""The images of `./dev image` (scripts/image_build.py), built and unpacked once per session for
test_images.py and test_helm_install.py. Each module had its own copy (module scope): the second
paid the build script again (a cache hit, but it hashes the tree and copies the archives) and a
second unpack of both images (umoci; 20-60 s on 2 cores, docs/testing.md). Neither module writes
into the unpacked root filesystems (the programs run from them under chroot, the chart's
components with a read-only root), so sharing them changes nothing either module proves.
test_containerfile_build.py builds other images and keeps its own fixtures of the same names."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.testing import oci
from tests.kube.image_fixtures import run_build


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_build("image_build.py", tmp_path_factory.mktemp("images"), "--json")


@pytest.fixture(scope="session")
def images(built: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, oci.UnpackedImage]]:
    root = tmp_path_factory.mktemp("unpacked")
    out = {name: oci.unpack(Path(built["dir"]) / img["archive"], root / name)
           for name, img in built["images"].items()}
    yield out
    shutil.rmtree(root, ignore_errors=True)
