"""Build msgspec's decoding information for the Kubernetes models a process decodes, once, up
front, in one thread.

lightkube decodes API responses with msgspec, which builds a Struct type's decoding information
on first use and caches it on the class. Two threads doing that at the same time for the same
type crash the process (``segfault at 0 … in _core…so``; msgspec 0.22.0, lightkube 1.0.1): four
threads decoding a Pod list for the first time crashed Python in 158 of 200 runs here, and in
none of 100 once the Pod decoder had been built first. Processes that decode Kubernetes objects
from more than one thread call :func:`warm` before they start them: the API server (its cache,
reconcile and history threads and the request thread pool) and tessera-node (its kubelet plugin's
gRPC threads beside the agent's loop). Layer 0: no other part of tessera is imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from lightkube.core import decoders
from lightkube.models.meta_v1 import Status
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import (
    ConfigMap,
    Event,
    Namespace,
    Node,
    PersistentVolumeClaim,
    Pod,
    ServiceAccount,
)

MODELS: tuple[type, ...] = (Pod, Node, Namespace, ConfigMap, Event, Lease, ServiceAccount,
                            PersistentVolumeClaim)
"""Every typed lightkube resource tessera's processes read."""

_EMPTY_LIST = b'{"items":[]}'


def warm(models: Iterable[type[Any]] = MODELS) -> None:
    """Builds the decoders of ``models`` (objects, lists, watch events, Status) in this thread."""
    for model in models:
        msgspec.json.Decoder(model)
        decoders.decode_list(_EMPTY_LIST, model)
    msgspec.json.Decoder(Status)
    msgspec.json.Decoder(decoders.WatchEvent)
