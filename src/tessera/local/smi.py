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


def _devices(env: dict[str, str]) -> list[dict[str, object]]:
    """Each visible share as nvidia-smi's query fields read it (memory in MiB)."""
    def col(key: str) -> list[str]:
        return env.get(key, "").split(",")
    uuids = [v for v in col("TESSERA_SHARE_UUIDS") if v]
    products, totals, limits = col("TESSERA_SHARE_PRODUCTS"), col("TESSERA_SHARE_DEVICE_BYTES"), col("TESSERA_SHARE_LIMIT_BYTES")
    out = []
    for i, uuid in enumerate(uuids):
        total = int(totals[i]) if i < len(totals) and totals[i].isdigit() else 0
        limit = int(limits[i]) if i < len(limits) and limits[i].isdigit() else total
        out.append({"index": i, "name": products[i] if i < len(products) else "?", "uuid": uuid,
                    "memory.total": limit // MiB, "memory.used": 0, "memory.free": limit // MiB,
                    "utilization.gpu": 0, "utilization.memory": 0, "count": len(uuids),
                    "driver_version": "tessera-simulated", "pci.bus_id": f"00000000:{i:02X}:00.0"})
    return out


_UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB",
          "utilization.gpu": "%", "utilization.memory": "%"}
_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}


def query(env: dict[str, str], fields: str, fmt: str) -> tuple[int, str]:
    """``--query-gpu=FIELDS --format=csv[,noheader][,nounits]`` as nvidia-smi answers it."""
    opts = [o.strip() for o in fmt.split(",")]
    if "csv" not in opts:
        return 2, '"--format" must be csv (csv, noheader, nounits)'
    names = [f.strip() for f in fields.split(",") if f.strip()]
    devices = _devices(env)
    valid = set(_devices({"TESSERA_SHARE_UUIDS": "x"})[0])
    for f in names:
        if _ALIASES.get(f, f) not in valid:
            return 2, f'Field "{f}" is not a valid field to query.'
    lines = []
    if "noheader" not in opts:
        lines.append(", ".join(f + (f" [{_UNITS[_ALIASES.get(f, f)]}]" if _ALIASES.get(f, f) in _UNITS
                                    and "nounits" not in opts else "") for f in names))
    for d in devices:
        values = []
        for f in names:
            key = _ALIASES.get(f, f)
            unit = _UNITS.get(key)
            values.append(f"{d[key]} {unit}" if unit and "nounits" not in opts else str(d[key]))
        lines.append(", ".join(values))
    return 0, "\n".join(lines)


def answer(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """What ``nvidia-smi ARGV`` prints here: the table, ``-L``, or a CSV query."""
    fields = fmt = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-L", "--list-gpus"):
            return 0, "\n".join(f"GPU {d['index']}: {d['name']} (UUID: {d['uuid']})"
                                for d in _devices(env)) or "No devices were found"
        if arg.startswith("--query-gpu="):
            fields = arg.split("=", 1)[1]
        elif arg in ("--query-gpu", "--format") and i + 1 < len(argv):
            if arg == "--query-gpu":
                fields = argv[i + 1]
            else:
                fmt = argv[i + 1]
            i += 1
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg in ("-h", "--help"):
            return 0, ("tessera-smi (simulated GPUs): nvidia-smi [-L] "
                       "[--query-gpu=FIELDS --format=csv[,noheader][,nounits]]")
        i += 1
    if fields is not None:
        if fmt is None:
            return 2, '"--format" option must be specified with --query-gpu (e.g. --format=csv)'
        return query(env, fields, fmt)
    return 0, render(env)


def main(argv: list[str] | None = None) -> int:
    code, text = answer(sys.argv[1:] if argv is None else argv, dict(os.environ))
    stream = sys.stdout if code == 0 else sys.stderr
    try:
        stream.write(text + "\n")
        stream.flush()
    except BrokenPipeError:  # `nvidia-smi | head -3`: the reader left; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    return code


if __name__ == "__main__":
    sys.exit(main())
