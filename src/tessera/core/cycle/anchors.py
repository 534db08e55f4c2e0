"""Gang anchors: the pods a gang cannot run without (``Workload.anchors``).

A Ray head, a Kubeflow Master/Chief/Launcher, the worker 0 of an elastic PyTorchJob with no
Master (the Kubernetes webhook marks them ``tessera.io/gang-anchor``), the pod 0 of an elastic
embedded training (its rendezvous host). The rule, the same in both backends:

* **Start**: a gang starts only with every anchor placed, in addition to its minimum: its
  unplaced anchors come first in the order its pods are tried (``WorkloadState.unplaced``), they
  count towards the pods that must start together (``WorkloadState.required``: at least the
  anchors not yet placed, even when the minimum already runs), and the first anchor that does
  not fit ends the attempt (``Session.place_pods``): the gang waits, told
  ``anchor pod NAME does not fit: ...``, and reclaim makes room for that pod first.
* **Grow**: a running gang whose anchor is not placed (its pod was recreated) is not started:
  its further pods wait until the anchor is placed, together with it or after it.
* **Shrink**: an anchor is never given back as an elastic pod (``shrinkable``).

A workload without anchors is untouched by all of this (each hook costs one empty-tuple test).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tessera.core.state import Placement


def anchors_first(unplaced: list[int], anchors: tuple[int, ...]) -> list[int]:
    """``unplaced`` (ascending pod indexes) with the anchors among them first, each part in
    index order."""
    first = [i for i in unplaced if i in anchors]
    if not first:
        return unplaced
    return first + [i for i in unplaced if i not in anchors]


def missing(anchors: tuple[int, ...], placements: Sequence[Placement | None]) -> list[int]:
    """The ``anchors`` not placed now (``placements``: a workload's, per pod), in the order
    they are tried."""
    return [i for i in sorted(anchors) if placements[i] is None] if anchors else []


def failed_anchor(anchors: tuple[int, ...], placements: Sequence[Placement | None],
                  fitted: int) -> int | None:
    """The anchor whose failure ended a placement attempt that fitted ``fitted`` pods (the
    anchors are tried first and the first one that does not fit ends it), or None when the
    attempt got past the anchors."""
    left = missing(anchors, placements)
    return left[fitted] if fitted < len(left) else None


def shrinkable(anchors: tuple[int, ...], pods: Iterable[int]) -> list[int]:
    """``pods`` less the ``anchors``."""
    return [i for i in pods if i not in anchors] if anchors else list(pods)
