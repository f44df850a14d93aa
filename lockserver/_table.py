"""An in-memory table of exclusive, leased locks on byte-string descriptors.

Locks exist for liveness only (rule S5): the transaction protocol stays correct
when any lock is lost. So the table is deliberately simple and in memory; a
restart loses every lock and changes the epoch, and tokens of an older epoch are
rejected so that no client believes it still holds a lock it lost. A table that
served one term of a replicated control plane is closed when the term ends
(:meth:`LockTable.close`): its grants end with it, and calls still waiting in it fail
instead of being granted after the term.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from wire import metrics
from wire.errors import ServiceUnavailableError, StaleTokenError

log = logging.getLogger(__name__)

#: Upper bound on a lease: a lease is a promise that the holder is alive, and one
#: longer than this means a dead client blocks others for too long.
MAX_LEASE_MS = 10 * 60 * 1000
MAX_DESCRIPTOR_BYTES = 4096


class LockToken(NamedTuple):
    """Proof of holding a batch of locks: valid only in the epoch that issued it."""

    epoch: int
    lock_id: int


class LockTableClosedError(ServiceUnavailableError):
    """This lock table was closed (its term of the control plane ended): it grants,
    refreshes and releases nothing more. The caller asks whoever serves locks now."""


@dataclass(slots=True)
class _Grant:
    token: LockToken
    owner: str
    descriptors: tuple[bytes, ...]
    lease_ms: int
    expires_at: float
    acquired: int = 0  # descriptors acquired so far, in sorted order


@dataclass(slots=True)
class _Slot:
    holder: _Grant | None = None
    queue: deque[_Grant] = field(default_factory=deque)


def _check_descriptors(descriptors: Iterable[bytes]) -> tuple[bytes, ...]:
    if isinstance(descriptors, bytes | str):
        raise TypeError("descriptors must be an iterable of bytes, not a single value")
    out = set()
    for d in descriptors:
        if not isinstance(d, bytes):
            raise TypeError(f"lock descriptor must be bytes, got {type(d).__name__}")
        if not d:
            raise ValueError("lock descriptor must not be empty")
        if len(d) > MAX_DESCRIPTOR_BYTES:
            raise ValueError(f"lock descriptor longer than {MAX_DESCRIPTOR_BYTES} bytes")
        out.add(d)
    if not out:
        raise ValueError("at least one lock descriptor is required")
    return tuple(sorted(out))


def _check_ms(name: str, value: object, *, upper: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be int milliseconds, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    if upper is not None and value > upper:
        raise ValueError(f"{name} must be at most {upper}, got {value}")
    return value


class LockTable:
    """Exclusive locks with owners, leases, FIFO waiting and an epoch.

    A batch is acquired all-or-nothing, descriptor by descriptor in sorted order,
    so two batches can never wait for each other in a cycle. Each descriptor
    serves waiters first-come first-served. A holder whose lease ran out is
    treated as gone: the next waiter takes the lock, and the old token no longer
    refreshes or releases anything.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.epoch = secrets.randbits(63)
        self._cond = threading.Condition()
        self._slots: dict[bytes, _Slot] = {}
        self._grants: dict[int, _Grant] = {}
        self._ids = itertools.count(1)
        self._closed = False
        metrics.track_locks_held(self.__len__)

    def close(self) -> None:
        """End every grant and refuse every call from now on; calls waiting in the
        table wake up and raise :class:`LockTableClosedError`. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._grants.clear()
            self._slots.clear()
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        """The caller holds the condition."""
        if self._closed:
            raise LockTableClosedError(
                f"lock table of epoch {self.epoch} was closed: its term ended"
            )

    # --- acquiring ---------------------------------------------------------------

    def lock(
        self,
        descriptors: Iterable[bytes],
        owner: str,
        lease_ms: int,
        wait_timeout_ms: int = 0,
    ) -> LockToken | None:
        """Lock every descriptor or none. Returns a token, or ``None`` on timeout."""
        wanted = _check_descriptors(descriptors)
        if not isinstance(owner, str) or not owner:
            raise ValueError("owner must be a non-empty str")
        lease = _check_ms("lease_ms", lease_ms, upper=MAX_LEASE_MS)
        if lease == 0:
            raise ValueError("lease_ms must be positive")
        wait = _check_ms("wait_timeout_ms", wait_timeout_ms)
        with self._cond:
            self._check_open()
            now = self._clock()
            deadline = now + wait / 1000
            grant = _Grant(
                LockToken(self.epoch, next(self._ids)),
                owner,
                wanted,
                lease,
                # Held partial locks must not expire while the batch is still waiting.
                expires_at=deadline + lease / 1000,
            )
            self._grants[grant.token.lock_id] = grant
            waited_since: float | None = None  # for the metrics
            for descriptor in wanted:
                slot = self._slots.setdefault(descriptor, _Slot())
                slot.queue.append(grant)
                while not self._can_take(slot, grant):
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        slot.queue.remove(grant)
                        if slot.holder is None and not slot.queue:
                            del self._slots[descriptor]
                        self._drop(grant)
                        metrics.record_lock_wait(waited_since)
                        return None
                    waited_since = waited_since or time.monotonic()
                    self._cond.wait(min(remaining, self._time_to_expiry(slot)))
                    # Closed while waiting: the term ended, nothing may be granted in it.
                    self._check_open()
                slot.queue.popleft()
                slot.holder = grant
                grant.acquired += 1
            grant.expires_at = self._clock() + lease / 1000
            metrics.record_lock_wait(waited_since)
            return grant.token

    def _can_take(self, slot: _Slot, grant: _Grant) -> bool:
        if slot.queue[0] is not grant:
            return False
        holder = slot.holder
        if holder is None:
            return True
        if holder.expires_at <= self._clock():
            log.debug("lease of %s (%s) expired", holder.token, holder.owner)
            self._drop(holder)
            return True
        return False

    def _time_to_expiry(self, slot: _Slot) -> float:
        if slot.holder is None:
            return 0.05
        return max(slot.holder.expires_at - self._clock(), 0.001)

    def _drop(self, grant: _Grant) -> None:
        """Release everything ``grant`` holds; the caller holds the condition."""
        self._grants.pop(grant.token.lock_id, None)
        for descriptor in grant.descriptors[: grant.acquired]:
            slot = self._slots.get(descriptor)
            if slot is not None and slot.holder is grant:
                slot.holder = None
                if not slot.queue:
                    del self._slots[descriptor]
        grant.acquired = 0
        self._cond.notify_all()

    # --- holding -----------------------------------------------------------------

    def _live_grant(self, token: LockToken) -> _Grant | None:
        if not isinstance(token, LockToken):
            raise TypeError(f"expected LockToken, got {type(token).__name__}")
        if token.epoch != self.epoch:
            raise StaleTokenError(
                f"lock token from epoch {token.epoch}, server is at epoch {self.epoch}"
            )
        self._check_open()
        grant = self._grants.get(token.lock_id)
        if grant is None:
            return None
        if grant.expires_at <= self._clock():
            self._drop(grant)
            return None
        return grant

    def refresh(self, token: LockToken, lease_ms: int | None = None) -> bool:
        """Extend the lease; ``False`` when the locks were already lost."""
        if lease_ms is not None:
            _check_ms("lease_ms", lease_ms, upper=MAX_LEASE_MS)
        with self._cond:
            grant = self._live_grant(token)
            if grant is None:
                return False
            if lease_ms is not None:
                grant.lease_ms = lease_ms
            grant.expires_at = self._clock() + grant.lease_ms / 1000
            return True

    def unlock(self, token: LockToken) -> bool:
        """Release the batch; ``False`` when it was already lost (expired or released)."""
        with self._cond:
            grant = self._live_grant(token)
            if grant is None:
                return False
            self._drop(grant)
            return True

    # --- observing ---------------------------------------------------------------

    def holder(self, descriptor: bytes) -> str | None:
        """The owner currently holding ``descriptor`` under a live lease."""
        (d,) = _check_descriptors([descriptor])
        with self._cond:
            self._check_open()
            slot = self._slots.get(d)
            if slot is None or slot.holder is None:
                return None
            if slot.holder.expires_at <= self._clock():
                self._drop(slot.holder)
                return None
            return slot.holder.owner

    def wait_until_released(self, descriptors: Iterable[bytes], timeout_ms: int) -> bool:
        """Wait until no live lease holds any of ``descriptors``; ``False`` on timeout.

        Readers use this to wait on a writer that is committing instead of aborting it.
        Waiting does not queue: a reader never delays a writer.
        """
        wanted = _check_descriptors(descriptors)
        wait = _check_ms("timeout_ms", timeout_ms)
        with self._cond:
            self._check_open()
            deadline = self._clock() + wait / 1000
            while True:
                self._check_open()
                busy = [s for d in wanted if (s := self._slots.get(d)) and s.holder is not None]
                live = [s for s in busy if not self._expire_if_due(s)]
                if not live:
                    return True
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self._cond.wait(min([remaining] + [self._time_to_expiry(s) for s in live]))

    def _expire_if_due(self, slot: _Slot) -> bool:
        holder = slot.holder
        if holder is not None and holder.expires_at <= self._clock():
            self._drop(holder)
            return True
        return holder is None

    def __len__(self) -> int:
        """How many lock batches are currently granted (live or not yet reaped)."""
        with self._cond:
            return len(self._grants)
