"""tessera-node under exactly the privileges the Helm chart gives it (issue 27, item 1).

``helm template`` renders the chart; the tessera-node-agent DaemonSet's ``agent`` container
states the user, the capabilities (``drop: [ALL]`` plus ``add``) and
``allowPrivilegeEscalation``. :func:`wrap` turns an argv into one that runs under exactly those,
with ``setpriv`` (util-linux): the bounding, inheritable and ambient sets hold only the chart's
capabilities (as root, the process's permitted and effective sets are then just those), the
user and group are the container's, supplementary groups are cleared, and ``no_new_privs`` is set
when the chart forbids privilege escalation. Every tessera-node the test cluster starts
(tessera.testing.node_agents) runs this way when the tests run as root (CI does), so a
capability the chart loses fails the tests that need it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

AGENT_KIND, AGENT_NAME, AGENT_CONTAINER = "DaemonSet", "tessera-node-agent", "agent"


@dataclass(frozen=True)
class Privileges:
    uid: int
    gid: int
    capabilities: frozenset[str]
    """Lower-case names without ``CAP_`` (``chown``, ``kill``)."""
    no_new_privs: bool

    def wrap(self, argv: Sequence[str]) -> list[str]:
        caps = ",".join(["-all", *(f"+{c}" for c in sorted(self.capabilities))])
        out = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
               f"--bounding-set={caps}", f"--inh-caps={caps}", f"--ambient-caps={caps}"]
        if self.no_new_privs:
            out.append("--no-new-privs")
        return [*out, "--", *argv]

    def without(self, capability: str) -> Privileges:
        return Privileges(self.uid, self.gid, self.capabilities - {capability},
                          self.no_new_privs)


def agent_container(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    for d in docs:
        if d.get("kind") == AGENT_KIND and d["metadata"]["name"] == AGENT_NAME:
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["name"] == AGENT_CONTAINER:
                    return dict(c)
    raise LookupError(f"the chart renders no {AGENT_KIND} {AGENT_NAME} with a container "
                      f"{AGENT_CONTAINER}")


def from_container(container: dict[str, Any]) -> Privileges:
    """The privileges a container runtime gives ``container`` (a pod spec's container)."""
    sc = container.get("securityContext") or {}
    if sc.get("privileged"):
        raise ValueError("a privileged agent has every capability: nothing to emulate")
    caps = sc.get("capabilities") or {}
    drop = {c.upper() for c in caps.get("drop") or []}
    if "ALL" not in drop:
        raise ValueError("the agent's capabilities must start from drop: [ALL] (the runtime's "
                         "default set is not emulated)")
    add = frozenset(c.lower().removeprefix("cap_") for c in caps.get("add") or [])
    uid = int(sc.get("runAsUser", 0))
    gid = int(sc.get("runAsGroup", 0))
    return Privileges(uid, gid, add, not sc.get("allowPrivilegeEscalation", True))


def chart_privileges(*set_args: str) -> Privileges:
    """The agent's privileges in the chart rendered with ``--set`` ``set_args``."""
    from tessera.testing.webhook import helm_template

    return from_container(agent_container(helm_template(*set_args)))


def enforced() -> bool:
    """Whether tests can run the agent under the chart's privileges (root, setpriv present);
    set TESSERA_AGENT_FULL_PRIVILEGES=1 to run it unrestricted (debugging only)."""
    import shutil

    return (os.geteuid() == 0 and shutil.which("setpriv") is not None
            and os.environ.get("TESSERA_AGENT_FULL_PRIVILEGES") != "1")
