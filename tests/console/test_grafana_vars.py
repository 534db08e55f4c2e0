"""The Grafana dashboards (deploy/grafana) filter by project and node, and no panel mixes units:
a panel in bytes plots only byte series, a panel in seconds only seconds, counts go elsewhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((ROOT / "deploy" / "grafana" / name).read_text())  # type: ignore[no-any-return]


def test_variables_filter_every_series_that_has_the_label() -> None:
    cluster, nodes = _load("tessera-cluster.json"), _load("tessera-nodes.json")
    assert {v["name"] for v in cluster["templating"]["list"]} >= {"datasource", "project"}
    assert {v["name"] for v in nodes["templating"]["list"]} >= {"datasource", "node", "project"}
    for board, rules in ((cluster, {"tessera_project_": ["project"]}),
                         (nodes, {"tessera_gpu_": ["node"], "tessera_node_": ["node"],
                                  "tessera_container_": ["node", "project"]})):
        for panel in board["panels"]:
            for t in panel.get("targets", []):
                for prefix, labels in rules.items():
                    for m in re.finditer(prefix + r"[a-z_]+(\{[^}]*\})?", t["expr"]):
                        for label in labels:
                            assert f'{label}=~"${label}"' in (m.group(1) or ""), t["expr"]


def test_no_panel_mixes_units() -> None:
    for name in ("tessera-cluster.json", "tessera-nodes.json"):
        for panel in _load(name)["panels"]:
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
            metrics = {m for t in panel.get("targets", [])
                       for m in re.findall(r"tessera_[a-z_]+", t["expr"])}
            if unit == "bytes":
                assert all(m.endswith("_bytes") for m in metrics), (panel["title"], metrics)
            if unit == "s":
                assert all("seconds" in m for m in metrics), (panel["title"], metrics)
