"""The Containerfiles (deploy/images/) are built by tests/kube/deploy/test_containerfile_build.py
(buildah, chroot isolation); these quick checks keep them in step with what `./dev image` builds
and the chart expects:
every COPY source exists, the same user, venv and PATH, the node image built on the control
plane's. tests/kube/deploy/test_images.py checks the images `./dev image` builds by running them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "deploy" / "images"


def _build_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("image_build", ROOT / "scripts" / "image_build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_copy_sources_exist() -> None:
    text = (IMAGES / "Containerfile").read_text()
    sources = [s for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M)
               for s in line.split()[:-1]]
    assert sources
    for s in sources:
        assert (ROOT / s).exists(), s


def test_containerfiles_match_the_runtime_free_build() -> None:
    build = _build_module()
    cp = (IMAGES / "Containerfile").read_text()
    node = (IMAGES / "Containerfile.node").read_text()
    assert f"USER {build.UID}:{build.UID}" in cp
    assert f"nonroot:x:{build.UID}:{build.UID}" in cp
    path = next(e for e in build.ENV if e.startswith("PATH="))
    assert path in cp.replace(" \\\n    ", " ")
    assert "python3 -m venv /opt/tessera" in cp and "pip uninstall -y pip setuptools" in cp
    assert "FROM ${CONTROL_PLANE}" in node and "USER 0:0" in node
    assert build.version() in cp  # the label names the version the chart defaults to


def test_chart_default_image_is_what_the_build_tags() -> None:
    import yaml

    build = _build_module()
    values = yaml.safe_load((ROOT / "deploy/helm/tessera/values.yaml").read_text())["image"]
    chart = yaml.safe_load((ROOT / "deploy/helm/tessera/Chart.yaml").read_text())
    assert values["repository"] == f"{build.REPOSITORY}/tessera"
    assert values["nodeRepository"] == f"{build.REPOSITORY}/tessera-node"
    assert chart["appVersion"] == build.version()
