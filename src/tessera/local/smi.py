"""``nvidia-smi`` for simulated GPUs: the share a workload was given, read from its environment.

Put first on a workload's PATH (and on ``tessera exec``'s) only when the GPUs are simulated, so
the walkthrough's ``tessera exec frac05 -- nvidia-smi`` shows the share. It says plainly that
no GPU and no driver took part.
"""

from __future__ import annotations

import os
import sys

MiB = 2**20


def render(env: dict[str, str]) -> str:
    uuids = [v for v in env.get("TESSERA_SHARE_UUIDS", "").split(",") if v]
    products = env.get("TESSERA_SHARE_PRODUCTS", "").split(",")
    totals = env.get("TESSERA_SHARE_DEVICE_BYTES", "").split(",")
    requests = env.get("TESSERA_SHARE_REQUEST_BYTES", "").split(",")
    limits = env.get("TESSERA_SHARE_LIMIT_BYTES", "").split(",")
    headrooms = env.get("TESSERA_SHARE_HEADROOM_BYTES", "").split(",")
    width = 79
    rule = "+" + "-" * (width - 2) + "+"
    lines = [
        rule,
        "| tessera-smi: SIMULATED GPU (no NVIDIA driver here; nothing ran on a GPU)".ljust(width - 1)
        + "|",
        f"| workload {env.get('TESSERA_WORKLOAD_NAME', '?')} in project "
        f"{env.get('TESSERA_PROJECT', '?')}; isolation: {env.get('TESSERA_ISOLATION', 'off')}"
        .ljust(width - 1)[: width - 1] + "|",
        rule,
        "| GPU  Name                             |  Memory-Usage (visible total) |  Share |",
        rule,
    ]
    if not uuids:
        lines.append("| No devices were found (this workload has no GPU)".ljust(width - 1) + "|")
    for i, uuid in enumerate(uuids):
        total = int(totals[i]) if i < len(totals) and totals[i] else 0
        limit = int(limits[i]) if i < len(limits) and limits[i] else total
        request = int(requests[i]) if i < len(requests) and requests[i] else limit
        kept = int(headrooms[i]) if i < len(headrooms) and headrooms[i].isascii() and headrooms[i].isdigit() else 0
        usable = total - kept if 0 <= kept < total else total
        share = request / usable if usable else 0.0  # portions are of what the driver leaves
        name = (products[i] if i < len(products) else "?")[:32]
        memory = f"0MiB / {limit // MiB}MiB"
        lines.append(f"| {i:>3}  {name:<32} | {memory:>29} | {share:>5.2f} |")
        lines.append(f"|      {uuid:<70}|")
        if limit != request:
            lines.append(
                f"|      guaranteed {request // MiB}MiB, burst limit {limit // MiB}MiB of "
                f"{total // MiB}MiB".ljust(width - 1) + "|"
            )
        else:
            lines.append(f"|      {request // MiB}MiB of the device's {total // MiB}MiB".ljust(width - 1) + "|")
    lines.append(rule)
    return "\n".join(lines)


def main() -> int:
    print(render(dict(os.environ)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
