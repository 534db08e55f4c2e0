"""The HTTPS server: a small ASGI app (``/mutate``, ``/validate``, ``/healthz``, ``/readyz``)
served by uvicorn with TLS, plus the informers that keep nodes and projects in memory."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tessera.api.limits import declared_length, read_body, too_large
from tessera.core.errors import InvalidRequest
from tessera.core.mig import PROFILES
from tessera.core.model import Node
from tessera.kube import metrics, names
from tessera.kube.admission import claims, mutate, policy
from tessera.kube.admission.claims import Template
from tessera.kube.admission.mig_resources import MigOffer
from tessera.kube.admission.policy import ClusterView, WebhookConfig
from tessera.kube.admission.shape import check_pod_shape

log = logging.getLogger("tessera.webhook")

EPHEMERAL = "ephemeralcontainers"
MAX_REVIEW_BODY = 8 * 1024 * 1024
"""An AdmissionReview carries the object and the old object, each at most the API server's
3 MiB request limit; anything larger is not from the API server and is refused unread."""
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


REVIEW_THREADS = 4
"""Reviews decoded and checked at once; more wait their turn (each is bounded: the body by
MAX_REVIEW_BODY, the pod's containers by shape.MAX_CONTAINERS)."""
T = TypeVar("T")


def _decode(body: bytes) -> dict[str, Any] | None:
    """The review's ``request``, or None when the body is no AdmissionReview."""
    try:
        review = json.loads(body)
        request = review["request"]
        if not isinstance(request, dict) or not isinstance(request.get("kind") or {}, dict) \
                or not isinstance(request.get("uid", ""), str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return None
    return request


def _checked(rule: Callable[..., T], request: dict[str, Any], *args: Any) -> T:
    """``rule(request, *args)`` once the pod's shape (and size) is checked."""
    if (request.get("kind") or {}).get("kind") == "Pod":
        for key in ("object", "oldObject"):
            if request.get(key) is not None:
                check_pod_shape(request[key])
    return rule(request, *args)


def _response(uid: str, *, allowed: bool, message: str = "",
              patch: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    resp: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        resp["status"] = {"code": 400, "reason": "BadRequest", "message": message}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp}


def review_mutate(request: dict[str, Any], view: ClusterView,
                  config: WebhookConfig) -> dict[str, Any]:
    """The review's response; with ``config.rewrite_claims`` use :func:`review_mutate_claims`
    (a rewritten pod is admitted only once its template exists)."""
    out, template = review_mutate_claims(request, view, config)
    assert template is None, "a rewritten pod needs its template: use review_mutate_claims"
    return out


def review_mutate_claims(request: dict[str, Any], view: ClusterView, config: WebhookConfig,
                         gang: dict[str, str] | None = None
                         ) -> tuple[dict[str, Any], Template | None]:
    """The review's response and the ResourceClaimTemplate that must exist in the pod's
    namespace before the response is sent (None: none needed). ``gang``: the pod's gang
    annotations (:func:`needs_gang`, :mod:`tessera.kube.admission.owners`)."""
    uid = request.get("uid", "")
    if request.get("kind", {}).get("kind") != "Pod":
        return _response(uid, allowed=True), None
    pod = request.get("object") or {}
    if request.get("subResource") == EPHEMERAL and request.get("operation") == "UPDATE":
        out = mutate.ephemeral_void(pod)
        return _response(uid, allowed=True,
                         patch=mutate.json_patch(pod, out) if out else None), None
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return _response(uid, allowed=True), None
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace", "")
    try:
        out, template = mutate.admitted(pod, namespace, view, config, gang)
    except InvalidRequest as exc:
        return _response(uid, allowed=False, message=str(exc)), None
    if out is None:
        return _response(uid, allowed=True), None
    return _response(uid, allowed=True, patch=mutate.json_patch(pod, out)), template


def needs_gang(request: dict[str, Any], config: WebhookConfig) -> bool:
    """Whether the review is a tessera pod's creation whose gang comes from its owners."""
    pod = request.get("object") or {}
    return (request.get("operation") == "CREATE" and not request.get("subResource")
            and (request.get("kind") or {}).get("kind") == "Pod"
            and bool((pod.get("metadata") or {}).get("ownerReferences"))
            and policy.asks_for_gpu(pod, config))


GangOf = Callable[[str, dict[str, Any], WebhookConfig], Awaitable[dict[str, str]]]
"""The gang annotations of a pod (``OwnerReader.gang_annotations``)."""


EnsureTemplate = Callable[[str, Template], Awaitable[None]]
"""Makes sure a ResourceClaimTemplate exists in a namespace; raises InvalidRequest if not."""


def template_writer(client: Any) -> EnsureTemplate:
    """Checks that the template there asks the same (``get``), or creates it (``create``): a
    template of that name with another spec (made by someone else) refuses the pod."""
    from lightkube import ApiError
    from lightkube.generic_resource import create_namespaced_resource

    resource = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaimTemplate",
                                          "resourceclaimtemplates")

    def failed(namespace: str, template: Template, exc: ApiError) -> InvalidRequest:
        return InvalidRequest(
            "spec.resourceClaims", f"the GPU request was rewritten into a claim from "
            f"ResourceClaimTemplate {namespace}/{template.name}, which could not be created "
            f"({exc.status.code} {exc.status.reason}: {exc.status.message}); the pod is "
            "refused rather than started without its GPU")

    async def stored(namespace: str, template: Template) -> dict[str, Any] | None:
        try:
            got = await client.get(resource, template.name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise failed(namespace, template, exc) from None
        return dict(got.to_dict())

    async def ensure(namespace: str, template: Template) -> None:
        # One get per pod once the namespace has the template; a create the first time (and a
        # second get when another review created it in between).
        there = await stored(namespace, template)
        if there is None:
            try:
                await client.create(resource.from_dict(template.manifest(namespace)))
                return
            except ApiError as exc:
                if exc.status.code != 409:
                    raise failed(namespace, template, exc) from None
            there = await stored(namespace, template)
            if there is None:
                raise InvalidRequest("spec.resourceClaims", f"ResourceClaimTemplate "
                                     f"{namespace}/{template.name} was deleted while the pod "
                                     "was admitted; create the pod again")
        if not claims.same_spec((there.get("spec") or {}).get("spec") or {}, template.spec):
            raise InvalidRequest(
                "spec.resourceClaims", f"ResourceClaimTemplate {namespace}/{template.name} "
                "(the claim the webhook rewrites this GPU request into) exists and asks for "
                "something else; delete it (tessera makes it again) or turn the rewrite off")

    return ensure


def review_validate(request: dict[str, Any], view: ClusterView,
                    config: WebhookConfig) -> dict[str, Any]:
    uid = request.get("uid", "")
    kind = request.get("kind", {}).get("kind")
    if kind == "ConfigMap":
        try:
            policy.check_configmap(request, config)
        except InvalidRequest as exc:
            return _response(uid, allowed=False, message=str(exc))
        return _response(uid, allowed=True)
    if kind != "Pod":
        return _response(uid, allowed=True)
    pod = request.get("object") or {}
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace", "")
    try:
        if request.get("subResource") == EPHEMERAL:
            policy.check_ephemeral(pod)
        elif request.get("subResource"):
            pass
        elif request.get("operation") == "UPDATE":
            user = (request.get("userInfo") or {}).get("username", "")
            policy.check_update(request.get("oldObject") or {}, pod, user, config)
        elif request.get("operation") == "CREATE":
            if not policy.asks_for_gpu(pod, config):
                policy.check_user_fields(pod)
            else:
                if not view.synced():
                    raise InvalidRequest("tessera-webhook", "is starting (caches not synced "
                                         "yet); retry in a few seconds")
                policy.check_final(pod, namespace, view, config)
    except InvalidRequest as exc:
        return _response(uid, allowed=False, message=str(exc))
    return _response(uid, allowed=True)


@dataclass
class WebhookApp:
    """ASGI app. ``view`` is read on every request; it is filled by the informers."""

    view: ClusterView
    config: WebhookConfig
    latencies: list[tuple[str, float]] = field(default_factory=list)
    record_latency: bool = False
    ensure_template: EnsureTemplate | None = None
    """Where ``config.rewrite_claims``: creates a rewritten pod's ResourceClaimTemplate."""
    _semaphore: asyncio.Semaphore | None = None
    gang_of: GangOf | None = None
    """Reads a controller's pod's owners for its gang (None: pods keep only what they state)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/healthz":
            await self._send(send, 200, b"ok", "text/plain")
            return
        if method == "GET" and path == "/metrics":
            await self._send(send, 200, generate_latest(metrics.WEBHOOK), CONTENT_TYPE_LATEST)
            return
        if method == "GET" and path == "/readyz":
            ready = self.view.synced()
            await self._send(send, 200 if ready else 503, b"ok" if ready else b"caches not synced",
                             "text/plain")
            return
        if method != "POST" or path not in ("/mutate", "/validate"):
            await self._send(send, 404, b"not found", "text/plain")
            return
        t0 = time.perf_counter()
        length = declared_length(scope)
        body = None if length is not None and length > MAX_REVIEW_BODY else \
            await read_body(receive, MAX_REVIEW_BODY)
        if body is None:
            await too_large(send, MAX_REVIEW_BODY, as_json=False)
            return
        # Decoding and the rules run on worker threads (at most REVIEW_THREADS at once): a big
        # review never holds the event loop, so small ones are answered meanwhile.
        async with self._slots():
            request = await asyncio.to_thread(_decode, body)
            if request is None:
                await self._send(send, 400, b"expected an AdmissionReview v1", "text/plain")
                return
            out = await self._review(path, request)
        if not out["response"]["allowed"]:
            obj = request.get("object")
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            log.info("%s %s/%s refused: %s", path, request.get("namespace"),
                     (meta.get("name") if isinstance(meta, dict) else None)
                     or request.get("name"), out["response"]["status"]["message"])
        await self._send(send, 200, json.dumps(out).encode(), "application/json")
        metrics.ADMISSION_SECONDS.labels(path[1:]).observe(time.perf_counter() - t0)
        if self.record_latency:
            self.latencies.append((path, time.perf_counter() - t0))

    def _slots(self) -> asyncio.Semaphore:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(REVIEW_THREADS)
        return self._semaphore

    async def _review(self, path: str, request: dict[str, Any]) -> dict[str, Any]:
        uid = request.get("uid", "")
        try:
            if path == "/mutate":
                gang = None
                if self.gang_of is not None and needs_gang(request, self.config):
                    obj = request.get("object") or {}
                    gang = await self.gang_of(str(request.get("namespace") or (
                        obj.get("metadata") or {}).get("namespace", "")), obj, self.config)
                out, template = await asyncio.to_thread(
                    _checked, review_mutate_claims, request, self.view, self.config, gang)
                if template is not None and out["response"]["allowed"] \
                        and not request.get("dryRun"):  # sideEffects: NoneOnDryRun
                    if self.ensure_template is None:
                        raise RuntimeError("rewrite_claims without a template writer")
                    obj = request.get("object") or {}
                    namespace = str(request.get("namespace")
                                    or (obj.get("metadata") or {}).get("namespace", ""))
                    await self.ensure_template(namespace, template)
            else:
                out = await asyncio.to_thread(
                    _checked, review_validate, request, self.view, self.config)
        except InvalidRequest as exc:
            out = _response(uid, allowed=False, message=str(exc))
            metrics.REFUSALS.labels(path[1:], metrics.refusal_field(exc.field)).inc()
        except Exception:  # a bug must refuse (fail closed), never admit unchecked
            log.exception("admission review failed")
            out = _response(uid, allowed=False,
                            message="tessera-webhook: internal error (see the webhook's log)")
        return out

    @staticmethod
    async def _send(send: Send, status: int, body: bytes, ctype: str) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class InformerView:
    """A ClusterView over the scheduler's informers for Nodes and Projects. Reviews read it
    from worker threads while the informers change it on the event loop: each read copies the
    informer's items first (one atomic step under the GIL).

    What a review needs is derived once per change, not per review: the namespace -> project
    map, and one node of each distinct GPU shape (a request that fits no node fits none of its
    twins either, so ``check_against_cluster`` over 500 identical nodes needs only one)."""

    def __init__(self, client: Any) -> None:
        from lightkube.resources.core_v1 import Node as NodeResource

        from tessera.kube.informer import Informer
        from tessera.kube.objects import ProjectResource, node_info, project_info

        def by_name(obj: Any) -> str:
            return str(obj.metadata.name)

        self.nodes_informer: Any = Informer(client, NodeResource, by_name, node_info,
                                            self._nodes_changed, name="nodes")
        self.projects_informer: Any = Informer(client, ProjectResource, by_name, project_info,
                                               self._projects_changed, name="projects")
        self._namespaces: dict[str, str] | None = None
        self._shapes: list[Node] | None = None
        self._mig: MigOffer | None = None

    def _nodes_changed(self, *_: object) -> None:
        self._shapes = None
        self._mig = None

    def _projects_changed(self, *_: object) -> None:
        self._namespaces = None

    def tasks(self) -> list[Awaitable[None]]:
        return [self.nodes_informer.run(), self.projects_informer.run()]

    def synced(self) -> bool:
        return bool(self.nodes_informer.synced.is_set() and self.projects_informer.synced.is_set())

    def nodes(self) -> Iterable[Node]:
        if self._shapes is None:
            self._shapes = distinct_shapes(
                n.node for n in list(self.nodes_informer.items.values())
                if n.node is not None)
        return self._shapes

    def mig_offer(self) -> MigOffer:
        """The GPU operator MIG resources some node advertises, and the profiles of the GPUs
        in MIG mode tessera-node reports (tessera makes those partitions)."""
        if self._mig is None:
            infos = list(self.nodes_informer.items.values())
            self._mig = MigOffer(
                frozenset(k for n in infos for k, v in n.resources
                          if k.startswith(names.MIG_RESOURCE_PREFIX) and v > 0),
                frozenset(p for n in infos for g in n.mig for p in PROFILES[g.model]))
        return self._mig

    def project_of(self, namespace: str) -> str | None:
        if self._namespaces is None:
            self._namespaces = {p.namespace: str(p.name)
                                for p in list(self.projects_informer.items.values())
                                if p.namespace}
        return self._namespaces.get(namespace)

    def as_view(self) -> ClusterView:
        return ClusterView(nodes=self.nodes, project_of=self.project_of, synced=self.synced,
                           mig_offer=self.mig_offer)


def distinct_shapes(nodes: Iterable[Node]) -> list[Node]:
    """One node per distinct multiset of (GPU model, memory)."""
    seen: dict[tuple[tuple[str, int], ...], Node] = {}
    for node in nodes:
        shape = tuple(sorted((g.model, g.memory) for g in node.gpus))
        seen.setdefault(shape, node)
    return list(seen.values())


PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass
class ProbesOnly:
    """The app's probe and metrics routes, nothing else: what the plain-HTTP probe port serves
    while the review port asks every caller for a client certificate."""

    app: WebhookApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PROBE_PATHS:
            await self.app._send(send, 404, b"reviews are served on the TLS port", "text/plain")
            return
        await self.app(scope, receive, send)


async def serve(*, host: str, port: int, certfile: str, keyfile: str, config: WebhookConfig,
                client: Any, ready: Callable[[int], None] | None = None,
                record_latencies: str | None = None, client_ca: str | None = None,
                probe_port: int | None = None) -> None:
    """Run the informers and the HTTPS server until cancelled or told to stop (SIGTERM).

    ``client_ca``: the TLS handshake requires a client certificate signed by it (the API
    server's, from its admission configuration), so nobody else can send reviews.
    ``probe_port``: also serve /healthz, /readyz and /metrics over plain HTTP there (kubelet
    probes carry no client certificate)."""
    import ssl

    import uvicorn

    informers = InformerView(client)
    from tessera.kube.admission.owners import OwnerReader

    app = WebhookApp(informers.as_view(), config, record_latency=bool(record_latencies),
                     ensure_template=template_writer(client) if config.rewrite_claims else None,
                     gang_of=OwnerReader(client).gang_annotations)
    tls: dict[str, Any] = {}
    if client_ca:
        tls = {"ssl_ca_certs": client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    uv = uvicorn.Config(app, host=host, port=port, ssl_certfile=certfile, ssl_keyfile=keyfile,
                        log_level="warning", access_log=False, lifespan="on",
                        timeout_keep_alive=60, **tls)
    probes = None if probe_port is None else uvicorn.Server(uvicorn.Config(
        ProbesOnly(app), host=host, port=probe_port, log_level="warning", access_log=False,
        lifespan="off"))
    server = uvicorn.Server(uv)
    tasks = [asyncio.ensure_future(t) for t in informers.tasks()]
    if probes is not None:
        tasks.append(asyncio.ensure_future(probes.serve()))
    try:
        serving = asyncio.ensure_future(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if serving.done():
            serving.result()
        bound = port
        for s in server.servers:
            for sock in s.sockets:
                bound = sock.getsockname()[1]
        log.info("tessera-webhook listening on https://%s:%d%s", host, bound,
                 f" (client certificates signed by {client_ca} only)" if client_ca else "")
        if ready:
            ready(bound)
        await serving
    finally:
        for t in tasks:
            t.cancel()
        if record_latencies:
            with open(record_latencies, "w") as f:
                json.dump(app.latencies, f)
