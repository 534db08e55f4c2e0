"""Placement: which node and which device(s) a request runs on."""

from tessera.core.placement.placer import NoFit, Placer
from tessera.core.placement.policies import DEFAULT_POLICY, POLICIES
from tessera.core.state import Placement

__all__ = ["DEFAULT_POLICY", "POLICIES", "NoFit", "Placement", "Placer"]
