"""Leader election on a coordination.k8s.io Lease, so two replicas never both act.

As client-go does it: a replica takes the Lease only when the holder has not renewed it for
``lease_duration`` seconds as measured on this replica's own monotonic clock (no trust in
clock agreement between machines), writes with the Lease's resourceVersion so that of two
replicas racing only one wins (the other gets 409), and the leader stops acting (the process
exits) once it has not managed to renew for ``renew_deadline`` seconds, which is shorter than
``lease_duration``: by the time another replica may take over, the old one has stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

log = logging.getLogger(__name__)


class LostLeadership(RuntimeError):
    pass


def _now() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._observed: tuple[str | None, str | None] | None = None
        self._observed_at = 0.0
        self.last_renew = 0.0
        self._mine: Lease | None = None
        """The Lease as this replica last wrote it, while it holds it: a renewal writes over
        it without reading it first (client-go's fast path); a conflict reads it again."""

    def _spec(self, lease: Lease | None, transitions: int) -> LeaseSpec:
        now = _now()
        acquire = now if lease is None or lease.spec is None or lease.spec.holderIdentity != self.identity \
            else (lease.spec.acquireTime or now)
        return LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.lease_duration)),
            acquireTime=acquire,
            renewTime=now,
            leaseTransitions=transitions,
        )

    async def try_acquire_or_renew(self) -> bool:
        mine = self._mine
        self._mine = None
        if mine is not None and mine.spec is not None \
                and time.monotonic() - self.last_renew < self.lease_duration:
            # Still the holder by this replica's own clock: one write, guarded by the
            # resourceVersion this replica wrote (409: someone else wrote since; read it).
            mine.spec = self._spec(mine, mine.spec.leaseTransitions or 0)
            try:
                self._wrote(await self.client.replace(mine))
                return True
            except ApiError as exc:
                if exc.status.code != 409:
                    raise
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            try:
                self._wrote(await self.client.create(
                    Lease(metadata=ObjectMeta(name=self.name, namespace=self.namespace),
                          spec=self._spec(None, 0)),
                ))
            except ApiError as exc2:
                if exc2.status.code == 409:
                    return False
                raise
            return True
        spec = lease.spec
        holder = spec.holderIdentity if spec else None
        renew = str(spec.renewTime) if spec and spec.renewTime else None
        now = time.monotonic()
        if self._observed != (holder, renew):
            if holder and holder != self.identity and (self._observed or (None,))[0] != holder:
                log.info("leader: lease %s/%s is held by %s; standing by", self.namespace,
                         self.name, holder)
            self._observed = (holder, renew)
            self._observed_at = now
        if holder and holder != self.identity and now - self._observed_at < self.lease_duration:
            return False
        transitions = (spec.leaseTransitions or 0) if spec else 0
        if holder != self.identity:
            transitions += 1
        lease.spec = self._spec(lease, transitions)
        try:
            self._wrote(await self.client.replace(lease))
        except ApiError as exc:
            if exc.status.code == 409:
                return False
            raise
        return True

    def _wrote(self, lease: Lease) -> None:
        """This replica wrote ``lease`` (holding it): renewed now, and the holder it has seen
        is itself (``keep`` stops at once on a failed renewal when it has seen another)."""
        self._mine = lease
        self.last_renew = time.monotonic()
        self._observed = (self.identity, None)
        self._observed_at = self.last_renew

    async def acquire(self) -> None:
        """Return once this replica holds the Lease."""
        while True:
            try:
                if await self.try_acquire_or_renew():
                    log.info("leader: %s holds lease %s/%s", self.identity, self.namespace, self.name)
                    return
            except Exception as exc:
                log.warning("leader election: %r", exc)
            await asyncio.sleep(self.retry_period)

    async def keep(self) -> None:
        """Renew until renewing fails for ``renew_deadline`` seconds; then raise LostLeadership."""
        while True:
            await asyncio.sleep(self.retry_period)
            try:
                ok = await asyncio.wait_for(self.try_acquire_or_renew(),
                                            max(self.retry_period * 2, self.renew_deadline / 2))
            except Exception as exc:
                log.warning("lease renewal failed: %r", exc)
                ok = False
            if not ok and time.monotonic() - self.last_renew > self.renew_deadline:
                raise LostLeadership(f"{self.identity} could not renew lease {self.name}")
            if not ok and self._observed and self._observed[0] not in (None, self.identity):
                raise LostLeadership(f"lease {self.name} is now held by {self._observed[0]}")

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once."""
        self._mine = None
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
            if lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = None
                lease.spec.leaseDurationSeconds = 1
                await self.client.replace(lease)
        except Exception as exc:
            log.info("lease release failed: %r", exc)
