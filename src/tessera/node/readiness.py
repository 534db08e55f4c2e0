"""tessera-node's start on Kubernetes: NVML's inventory and the GPUs' headroom, MIG, the
isolation library installed, the host directories usable. What fails is the node's ``reason``
(published on the Node; shares are not placed on a node that is not ready)."""

from __future__ import annotations

import logging
import os

from tessera.isolation.library import LibraryNotBuilt, library_path
from tessera.node.headroom import headroom_for
from tessera.node.install import InstallError, install_library
from tessera.node.reclaim import prepare_directory
from tessera.node.sync.base import NodeContext
from tessera.node.sync.mig_partitions import start_mig

log = logging.getLogger("tessera.node")


def prepare(node: NodeContext) -> None:
    try:
        _prepare(node)
    finally:
        node.prepared = True


def _prepare(node: NodeContext) -> None:
    opts = node.opts
    if node.nvml is not None:
        try:
            inventory = node.nvml.inventory()
        except Exception as exc:
            node.nvml_error = f"NVML inventory failed: {exc}"
            node.nvml = None
        else:
            # the headroom before the inventory: the inventory makes the node ready, and a
            # claim the kubelet plugin prepared in between got context-overhead 0
            if not node.headroom:
                node.headroom = headroom_for(inventory, node.nvml, opts.headroom_bytes,
                                             opts.measure_headroom)
                for h in node.headroom.values():
                    log.info("GPU %s: headroom %d MiB (%s)", h.uuid, h.bytes // 2**20, h.source)
            node.inventory = inventory
    start_mig(node)
    try:
        installed = install_library(library_path(), opts.library_dir, opts.library_mount)
        log.info("isolation library %s at %s%s", installed.digest, installed.version_path,
                 "" if installed.changed else " (already installed)")
        node.library_error = ""
    except (InstallError, LibraryNotBuilt) as exc:
        node.library_error = str(exc)
    try:
        if opts.loans_dir is not None:
            prepare_directory(opts.loans_dir)
    except OSError as exc:
        node.dir_error = f"loans directory {opts.loans_dir} cannot be made: {exc}"
        return
    try:
        opts.containers_dir.mkdir(parents=True, exist_ok=True)
        probe = opts.containers_dir / f".tmp-probe.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        node.dir_error = ""
    except OSError as exc:
        node.dir_error = f"containers directory {opts.containers_dir} is not writable: {exc}"
