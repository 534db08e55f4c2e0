"""The ``tessera-node`` command line.

    tessera-node inventory [--json]      what NVML reports (exit 1 with one line without NVML)
    tessera-node usage [--json]          memory, utilisation and processes per GPU, now
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tessera.node.nvml import Nvml, NvmlUnavailable


def _inventory(args: argparse.Namespace) -> int:
    try:
        with Nvml() as nvml:
            inv = nvml.inventory()
    except NvmlUnavailable as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(dataclasses.asdict(inv)))
        return 0
    print(f"driver {inv.driver_version}, CUDA {inv.cuda_version}")
    for g in inv.gpus:
        mig = " MIG" if g.mig_enabled else ""
        print(f"{g.index}  {g.uuid}  {g.name}  {g.memory_total // 2**20} MiB  {g.model}{mig}")
    for link in inv.links:
        print(f"GPU{link.a}-GPU{link.b}: {link.ancestor}{' nvlink' if link.nvlink else ''}")
    return 0


def _usage(args: argparse.Namespace) -> int:
    try:
        with Nvml() as nvml:
            usage = nvml.usage()
    except NvmlUnavailable as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([dataclasses.asdict(u) for u in usage]))
        return 0
    for u in usage:
        print(f"{u.index}  {u.uuid}  {u.memory_used}/{u.memory_total} B  util {u.utilization}%")
        for p in u.processes:
            print(f"    pid {p.pid}  {p.used_bytes} B  sm {p.sm_util}%")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera-node", description="tessera's node agent")
    sub = p.add_subparsers(dest="command", required=True)
    inv = sub.add_parser("inventory", help="print the GPU inventory NVML reports")
    inv.add_argument("--json", action="store_true")
    inv.set_defaults(func=_inventory)
    use = sub.add_parser("usage", help="print memory, utilisation and processes per GPU")
    use.add_argument("--json", action="store_true")
    use.set_defaults(func=_usage)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))
