"""The mutating webhook: a GPU pod in any spelling becomes a canonical, isolated tessera pod.

A share pod gets ``schedulerName: tessera``, the canonical annotations, its project, and on the
GPU container (the ConfigMap is ``<pod>-tessera-gpu``, named as the scheduler names it; a pod
created with ``generateName`` gets its name here, since mutating webhooks run before the API
server would generate it):

- ``NVIDIA_VISIBLE_DEVICES`` and ``TESSERA_GPU_MEMORY_LIMIT`` from that ConfigMap
  (``configMapKeyRef``, not optional: the container cannot start before the scheduler wrote it);
- the isolation library from the node (hostPath the node agent fills), preloaded by a file
  mounted over ``/etc/ld.so.preload``; the container's isolation config, read-only at
  ``/etc/tessera`` and the pod's accounting region at ``/run/tessera``, both hostPaths under
  ``containers_host_dir/KEY`` (KEY: the annotation ``tessera.io/gpu-config-key`` drawn here) that
  tessera-node writes (``type: Directory``: the container does not start before they exist);
- a supplemental group (``WebhookConfig.region_group``) when the pod states no group that every
  process of that container has: tessera-node gives the region to that group, mode 0660, so the
  pod's processes share it whatever UIDs they run as and nobody else can open it
  (:mod:`tessera.core.podgroups`).

A pod asking for a MIG profile (``tessera.io/gpu-mig-profile``, checked by
:func:`tessera.kube.admission.policy.check_mig`, or the GPU operator's ``nvidia.com/mig-…``
resource where tessera makes the partitions: :mod:`tessera.kube.admission.mig_resources`) gets
the canonical profile and, on its first container (or the one that asked for the resource),
``NVIDIA_VISIBLE_DEVICES`` from the same ConfigMap (the partition's ``MIG-…`` UUID,
written by tessera-node when it has made it; docs/mig.md).

Every other container gets ``NVIDIA_VISIBLE_DEVICES=void`` (a CUDA image would otherwise see
every GPU of the node through the NVIDIA runtime).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.core.podgroups import share_group
from tessera.kube import names
from tessera.kube.admission import claims, compute_spellings, mig_resources, policy
from tessera.kube.admission import spellings as sp
from tessera.kube.admission.policy import ClusterView, WebhookConfig
from tessera.kube.binder import configmap_name

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet and length the API server uses for generateName (apiserver's names.go)."""
_GENERATE_SUFFIX = 5
_MAX_GENERATED_BASE = 63 - _GENERATE_SUFFIX


def generated_name(generate_name: str) -> str:
    """A name from ``generateName`` the way the API server makes one."""
    base = generate_name[:_MAX_GENERATED_BASE]
    return base + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(_GENERATE_SUFFIX))


def pod_configmap(pod: Mapping[str, Any]) -> str:
    """The per-pod ConfigMap the scheduler writes (:func:`tessera.kube.binder.configmap_name`)."""
    return configmap_name(str((pod.get("metadata") or {}).get("name") or ""))


def _copy(value: Any) -> Any:
    """Deep copy of decoded JSON (dicts, lists, scalars): several times faster than deepcopy."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _set_env(container: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    names_ = {e["name"] for e in entries}
    env = [e for e in container.get("env") or [] if e.get("name") not in names_]
    container["env"] = env + entries


def _share_container(container: dict[str, Any], cm: str, t: sp.Translation,
                     config: WebhookConfig) -> None:
    static = policy.static_limit(t.request)
    entries: list[dict[str, Any]] = [
        {"name": key, "value": static} if key == policy.LIMIT_ENV and static is not None else
        {"name": key, "valueFrom": {"configMapKeyRef": {"name": cm, "key": key}}}
        for key in policy.CONFIGMAP_KEYS
    ]
    # Informational (cGPU's ALIYUN_COM_GPU_MEM_DEV): optional, unlike the keys isolation needs.
    entries += [{"name": key, "valueFrom": {"configMapKeyRef": {"name": cm, "key": key,
                                                               "optional": True}}}
                for key in t.configmap_env]
    entries.append({"name": policy.REGION_ENV, "value": f"{policy.REGION_DIR}/gpu-usage.region"})
    entries += [{"name": k, "value": v} for k, v in t.static_env.items()]
    _set_env(container, entries)
    mounts = list(container.get("volumeMounts") or [])
    mounts += [
        {"name": policy.LIBRARY_VOLUME, "mountPath": config.library_mount, "readOnly": True},
        {"name": policy.PRELOAD_VOLUME, "mountPath": policy.PRELOAD_PATH, "readOnly": True},
        {"name": policy.REGION_VOLUME, "mountPath": policy.REGION_DIR},
        {"name": policy.LOANS_VOLUME, "mountPath": policy.LOANS_DIR},
        {"name": policy.CONFIG_VOLUME, "mountPath": policy.CONFIG_DIR, "readOnly": True},
    ]
    container["volumeMounts"] = mounts
    for key in t.drop_resources:
        res = container.get("resources") or {}
        for part in ("limits", "requests"):
            if key in (res.get(part) or {}):
                del res[part][key]
                if not res[part]:
                    del res[part]


def _volumes(config: WebhookConfig, key: str, container: str) -> list[dict[str, Any]]:
    base = f"{config.containers_host_dir.rstrip('/')}/{key}"
    return [
        {"name": policy.LIBRARY_VOLUME,
         "hostPath": {"path": config.library_host_dir, "type": "Directory"}},
        {"name": policy.PRELOAD_VOLUME,
         "hostPath": {"path": config.preload_host_file, "type": "File"}},
        {"name": policy.CONFIG_VOLUME,
         "hostPath": {"path": f"{base}/conf/{container}", "type": "Directory"}},
        {"name": policy.REGION_VOLUME,
         "hostPath": {"path": f"{base}/region", "type": "Directory"}},
        {"name": policy.LOANS_VOLUME,
         "hostPath": {"path": config.loans_host_dir, "type": "Directory"}},
    ]


def mutated(pod: Mapping[str, Any], namespace: str, view: ClusterView,
            config: WebhookConfig) -> dict[str, Any] | None:
    """The pod as tessera stores it, or None when tessera leaves it alone (no GPU share and
    not scheduled by tessera). Raises InvalidRequest naming the field it refuses. Not for
    ``config.rewrite_claims`` (whose pods need a template too: :func:`admitted`)."""
    out, template = admitted(pod, namespace, view, config)
    assert template is None, "a rewritten pod needs its template: call admitted()"
    return out


def admitted(pod: Mapping[str, Any], namespace: str, view: ClusterView, config: WebhookConfig,
             gang: Mapping[str, str] | None = None
             ) -> tuple[dict[str, Any] | None, claims.Template | None]:
    """The pod as tessera stores it (None: left alone), and, when the request is rewritten into
    a claim (``config.rewrite_claims``), the ResourceClaimTemplate that must exist in the pod's
    namespace before it is admitted. ``gang``: annotations from the pod's owners
    (:mod:`tessera.kube.admission.owners`). Raises InvalidRequest naming the field it refuses."""
    policy.check_user_fields(pod)
    mig_ref: sp.ContainerRef | None = None
    rewritten = mig_resources.rewrite(pod, config.operator_mig, view.mig_offer())
    if rewritten is not None:
        pod, mig_ref = rewritten
    t = sp.translate(pod)
    spec_in = pod.get("spec") or {}
    scheduler = spec_in.get("schedulerName") or ""
    mig = policy.check_mig(pod)
    if t.spelling == sp.NONE and mig is None and scheduler != config.scheduler_name:
        return None, None
    if not view.synced():
        raise InvalidRequest("tessera-webhook", "is starting (node and project caches not "
                             "synced yet); retry in a few seconds")
    if t.shared:
        policy.check_privileged(pod)
    policy.check_cluster(t.request, view, t.renamed)
    if scheduler != config.scheduler_name and scheduler not in config.replaceable_schedulers:
        raise InvalidRequest("spec.schedulerName", f"a GPU-share pod is scheduled by "
                             f"{config.scheduler_name}, not another scheduler", scheduler)
    project = policy.project_for(namespace, view, config)
    given = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.PROJECT)
    if given is not None and given != project:
        raise InvalidRequest(sp.annotation_field(names.PROJECT), f"is set from the namespace: "
                             f"{namespace} belongs to project {project}", given)

    out: dict[str, Any] = _copy(dict(pod))
    meta = out.setdefault("metadata", {})
    ann = meta.get("annotations") or {}
    meta["annotations"] = ann
    ann.update(t.annotations)
    ann.update(compute_spellings.canonical(pod, t.request, mig=mig is not None, cluster_mode=config.compute_mode))
    ann.update(gang or {})
    ann[names.PROJECT] = project
    if mig is not None:
        ann[names.MIG_PROFILE] = mig
    spec = out.setdefault("spec", {})
    spec["schedulerName"] = config.scheduler_name
    if config.rewrite_claims and mig is None and claims.rewritable(t):
        # The claim's CDI devices give the container its GPU, the isolation library and its
        # limit (tessera-node's kubelet plugin): none of the annotation path's wiring applies.
        template = claims.rewrite(out, t)
        _void_others(spec)
        policy.check_final(out, namespace, view, config)
        return out, template
    if not meta.get("name") and meta.get("generateName"):
        # Mutating webhooks run before the API server generates the name, and the ConfigMap's
        # name (read through configMapKeyRef, fixed at creation) follows the pod's name.
        meta["name"] = generated_name(str(meta["generateName"]))
    if mig is not None and mig_ref is None:
        mig_ref = sp.pick_container(out, None, "spec.containers")
    cm = pod_configmap(out) if t.shared else None
    if cm is not None:
        assert t.container is not None
        key = secrets.token_hex(8)
        ann[names.GPU_CONFIG_KEY] = key
        gpu_c = (spec.get(t.container.kind) or [])[t.container.index]
        spec["volumes"] = list(spec.get("volumes") or []) + _volumes(
            config, key, str(gpu_c.get("name") or ""))
        if share_group(spec, str(gpu_c.get("name") or "")) is None:
            sc = dict(spec.get("securityContext") or {})
            sc["supplementalGroups"] = [*(sc.get("supplementalGroups") or []), config.region_group]
            spec["securityContext"] = sc
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            if t.container is not None and (kind, i) == (t.container.kind, t.container.index):
                assert cm is not None
                _share_container(c, cm, t, config)
                continue
            if mig_ref is not None and (kind, i) == (mig_ref.kind, mig_ref.index):
                # The MIG partition's UUID, written by tessera-node once it is made: the
                # container does not start before (configMapKeyRef, not optional).
                _set_env(c, [{"name": policy.VISIBLE_DEVICES, "valueFrom": {"configMapKeyRef": {
                    "name": pod_configmap(out), "key": policy.VISIBLE_DEVICES}}}])
                continue
            _void(c)
    policy.check_final(out, namespace, view, config)
    return out, None


def _void(c: dict[str, Any]) -> None:
    present, _ = sp.env_value(c, policy.VISIBLE_DEVICES)
    if not policy.device_plugin_gpus(c) and not present:
        _set_env(c, [{"name": policy.VISIBLE_DEVICES, "value": "void"}])


def _void_others(spec: dict[str, Any]) -> None:
    """Every container but the claims' gets ``NVIDIA_VISIBLE_DEVICES=void``."""
    for kind in ("containers", "initContainers"):
        for c in spec.get(kind) or []:
            if not claims.uses_claims(c):
                _void(c)


def json_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) replacing each changed metadata/spec field as a whole."""
    ops: list[dict[str, Any]] = []
    for section in ("metadata", "spec"):
        old, new = before.get(section) or {}, after.get(section) or {}
        for key, value in new.items():
            if old.get(key) != value:
                ops.append({"op": "add", "path": f"/{section}/{_escape(key)}", "value": value})
    return ops


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def ephemeral_void(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """``kubectl debug`` on a GPU pod: ephemeral containers get ``NVIDIA_VISIBLE_DEVICES=void``
    (a debug image built on CUDA would otherwise see every GPU of the node)."""
    containers = (pod.get("spec") or {}).get("ephemeralContainers") or []
    if all(sp.env_value(c, policy.VISIBLE_DEVICES)[0] for c in containers):
        return None
    out: dict[str, Any] = _copy(dict(pod))
    for c in out["spec"]["ephemeralContainers"]:
        if not sp.env_value(c, policy.VISIBLE_DEVICES)[0]:
            _set_env(c, [{"name": policy.VISIBLE_DEVICES, "value": "void"}])
    return out
