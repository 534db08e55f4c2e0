"""Inference that scales, in embedded mode: ``tessera inference submit NAME --port 8080
--min-replicas 1 --max-replicas 4 --metric concurrency --metric-threshold 2 -- CMD``.

The service is reached at one stable URL, ``http://127.0.0.1:PORT``: a TCP proxy there hands
each connection to the replica with the fewest open connections. Each replica is a one-pod
inference workload ``NAME-K`` whose process listens on ``$PORT`` (a free port drawn for it; the
proxy only sends it connections once that port accepts).

Scaling, by the rule both backends share (tessera.core.autoscale), on what the proxy records
itself, with the exact times connections open and close:

* ``concurrency``: the connections open through the proxy;
* ``throughput``: connections opened per second over the last 10 s;

``desired = ceil(metric / threshold)``, kept within ``[min, max]``. A higher ``desired`` starts
replicas at the next control cycle (a burst in the last 2 s counts); a lower one removes them
(idle ones first) once it has held for ``scale-down delay`` seconds (default 30) counted from the
moment the need fell (when idle: the moment the last connection closed). The control loop is
woken at that moment + the delay, so the decision is not a cycle late; the replicas removed are
stopped at once (SIGTERM, as any workload deleted). The proxy counts connections, so requests
sent over one kept-alive connection count once.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera.api.backend import WorkloadSubmission
from tessera.api.tcp_pipe import relay
from tessera.core.autoscale import (
    CONCURRENCY_WINDOW,
    THROUGHPUT_WINDOW,
    ScalingRule,
    decide,
    prune,
    rate,
)
from tessera.core.errors import InvalidRequest

DEFAULT_SCALE_DOWN_DELAY = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    workload_id: str
    port: int
    open: int = 0


@dataclass
class Service:
    name: str
    project: str
    port: int
    min_replicas: int
    max_replicas: int
    metric: str
    threshold: float
    scale_down_delay: float
    submission: WorkloadSubmission
    replicas: list[Replica] = field(default_factory=list)
    next_index: int = 0
    open: int = 0
    opened: deque[float] = field(default_factory=deque)
    """When connections were opened (the last ``THROUGHPUT_WINDOW`` seconds and more)."""
    steps: list[tuple[float, float]] = field(default_factory=list)
    """(time, connections open from then on), at every change."""
    created: float = field(default_factory=time.time)
    lower_since: float | None = None
    due: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    listener: socket.socket | None = None
    history: list[tuple[float, int]] = field(default_factory=list)
    """(time, replicas) at each change: what the scaling did."""

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rule(self) -> ScalingRule:
        return ScalingRule(self.min_replicas, self.max_replicas, self.metric, self.threshold,
                           self.scale_down_delay)

    def _horizon(self, now: float) -> float:
        return now - max(self.scale_down_delay, CONCURRENCY_WINDOW) - THROUGHPUT_WINDOW - 1

    def metric_steps(self, now: float) -> list[tuple[float, float]]:
        """The metric as a step function of time (tessera.core.autoscale.decide's input)."""
        with self.lock:
            horizon = self._horizon(now)
            while self.opened and self.opened[0] < horizon:
                self.opened.popleft()
            self.steps = prune(self.steps, horizon)
            if self.metric == "throughput":
                return rate(self.opened)
            return list(self.steps)

    def metric_value(self, now: float) -> float:
        if self.metric == "throughput":
            return sum(1 for t in self.opened if t > now - THROUGHPUT_WINDOW) / THROUGHPUT_WINDOW
        return float(self.open)

    def changed(self, now: float, by: int) -> None:
        """A connection opened (+1) or closed (-1) at ``now`` (called under ``lock``)."""
        self.open += by
        if by > 0:
            self.opened.append(now)
        if self.steps and self.steps[-1][0] == now:
            self.steps[-1] = (now, self.open)
        else:
            self.steps.append((now, self.open))


class Services:
    def __init__(self, submit: Callable[[WorkloadSubmission], dict[str, Any]],
                 delete: Callable[[str], None], phase_of: Callable[[str], tuple[str, str] | None],
                 wake: Callable[[], None] | None = None) -> None:
        """``wake``: run a control cycle soon (when a scale-down falls due)."""
        self._submit = submit
        self._wake = wake
        self._delete = delete
        self._phase_of = phase_of
        self.services: dict[str, Service] = {}

    def create(self, s: WorkloadSubmission, auto: dict[str, Any]) -> dict[str, Any]:
        ports = s.spec.get("ports") or []
        if len(ports) != 1:
            raise InvalidRequest("spec.ports", "an inference that scales serves one port "
                                 "(--port): its stable URL", len(ports))
        port = int(ports[0].get("external") or ports[0]["container"])
        key = f"{s.project}/{s.name}"
        if key in self.services:
            raise InvalidRequest("name", f"an inference named {s.name} already exists", s.name)
        try:
            listener = socket.create_server(("127.0.0.1", port))
        except OSError:
            raise InvalidRequest("spec.ports[0]", f"port {port} is already in use on 127.0.0.1",
                                 port) from None
        spec = {k: v for k, v in s.spec.items() if k not in ("ports", "autoscaling")}
        svc = Service(s.name, s.project, port, int(auto["minReplicas"]),
                      int(auto["maxReplicas"]), str(auto["metric"]),
                      float(auto["metricThreshold"]),
                      float(auto.get("scaleDownDelaySeconds", DEFAULT_SCALE_DOWN_DELAY)),
                      dataclasses.replace(s, spec=spec), listener=listener)
        try:
            first = self._add(svc)  # the first replica validates the request (quota, GPUs)
        except BaseException:
            listener.close()
            raise
        self.services[key] = svc
        threading.Thread(target=self._accept, args=(svc,), daemon=True,
                         name=f"inference-{s.name}").start()
        while len(svc.replicas) < svc.min_replicas:
            self._add(svc)
        return {**first, "name": s.name, "serviceUrls": [svc.url()], "inference": self.doc(svc)}

    def _add(self, svc: Service) -> dict[str, Any]:
        rport = _free_port()
        sub = svc.submission
        w = self._submit(dataclasses.replace(
            sub, name=f"{svc.name}-{svc.next_index}",
            env={**sub.env, "PORT": str(rport), "TESSERA_INFERENCE": svc.name},
            spec={**sub.spec, "inference": svc.name}))
        svc.next_index += 1
        with svc.lock:
            svc.replicas.append(Replica(str(w["workloadId"]), rport))
        svc.history.append((time.time(), len(svc.replicas)))
        return w

    def _accept(self, svc: Service) -> None:
        assert svc.listener is not None
        while True:
            try:
                conn, _ = svc.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(svc, conn), daemon=True).start()

    def _serve(self, svc: Service, conn: socket.socket) -> None:
        with svc.lock:
            svc.changed(time.time(), +1)
            order = sorted(svc.replicas, key=lambda r: r.open)
        upstream = None
        chosen = None
        deadline = time.monotonic() + 30
        while upstream is None and time.monotonic() < deadline:
            for r in order:  # the least busy replica that accepts (a new one may still start)
                try:
                    upstream = socket.create_connection(("127.0.0.1", r.port), timeout=1)
                    chosen = r
                    break
                except OSError:
                    continue
            if upstream is None:
                time.sleep(0.05)
                with svc.lock:
                    order = sorted(svc.replicas, key=lambda r: r.open)
        try:
            if upstream is None or chosen is None:
                return
            with svc.lock:
                chosen.open += 1
            relay(conn, upstream)
            with svc.lock:
                chosen.open -= 1
        finally:
            conn.close()
            if upstream is not None:
                upstream.close()
            with svc.lock:
                svc.changed(time.time(), -1)

    def tick(self) -> None:
        now = time.time()
        for svc in list(self.services.values()):
            with svc.lock:
                svc.replicas = [r for r in svc.replicas
                                if (self._phase_of(r.workload_id) or ("Deleted",))[0]
                                not in ("Deleted", "Failed", "Completed")]
            have = len(svc.replicas)
            d = decide(svc.rule(), have, svc.metric_steps(now), now, svc.created)
            svc.lower_since = d.lower_since  # the rule shared with Kubernetes (core.autoscale)
            if d.due is not None and d.due != svc.due and self._wake is not None:
                timer = threading.Timer(max(0.0, d.due - time.time()), self._wake)
                timer.daemon = True  # the control loop looks again exactly when it is due
                timer.start()
            svc.due = d.due
            if d.replicas > have:
                for _ in range(d.replicas - have):
                    try:
                        self._add(svc)
                    except InvalidRequest:
                        break
            elif d.replicas < have:
                with svc.lock:  # the idle ones first, the newest first
                    order = sorted(enumerate(svc.replicas),
                                   key=lambda x: (x[1].open == 0, x[0]), reverse=True)
                    victims = [r for _, r in order[:have - d.replicas]]
                    svc.replicas = [r for r in svc.replicas if r not in victims]
                for victim in victims:
                    self._delete(victim.workload_id)
                svc.history.append((now, len(svc.replicas)))

    def doc(self, svc: Service) -> dict[str, Any]:
        return {"url": svc.url(), "minReplicas": svc.min_replicas,
                "maxReplicas": svc.max_replicas, "metric": svc.metric,
                "metricThreshold": svc.threshold, "scaleDownDelaySeconds": svc.scale_down_delay,
                "replicas": len(svc.replicas), "metricValue": svc.metric_value(time.time()),
                "lowerNeedSince": svc.lower_since, "scaleDownDue": svc.due,
                "history": [{"time": t, "replicas": n} for t, n in svc.history]}

    def of_replica(self, workload_id: str) -> dict[str, Any] | None:
        """The doc of the service ``workload_id`` is a replica of (None: it is none)."""
        for svc in list(self.services.values()):
            if any(r.workload_id == workload_id for r in svc.replicas):
                return self.doc(svc)
        return None

    def find(self, project: str, name: str) -> Service | None:
        return self.services.get(f"{project}/{name}")

    def stop(self) -> None:
        for svc in self.services.values():
            if svc.listener is not None:
                svc.listener.close()
