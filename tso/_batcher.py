"""Coalesce concurrent timestamp requests into one call, one call in flight at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tso._oracle import TimestampRange


@dataclass(slots=True)
class _Request:
    count: int
    done: threading.Event = field(default_factory=threading.Event)
    result: TimestampRange | None = None
    error: BaseException | None = None
    leads: bool = False  # set when this request must issue the next call


class TimestampBatcher:
    """Client-side batching of timestamp requests, as Percolator's oracle clients do.

    While one call to ``fetch`` is in flight, new callers queue up; when it returns,
    the next caller in line issues one call for the whole queue and hands each
    waiter its own slice. Every caller gets distinct timestamps, and each caller's
    timestamps are above every timestamp handed out before its call began.
    """

    def __init__(self, fetch: Callable[[int], TimestampRange]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._pending: list[_Request] = []
        self._in_flight = False
        self.calls = 0  # how many times fetch ran: for tests and metrics

    def next_range(self, count: int) -> TimestampRange:
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"count must be int, got {type(count).__name__}")
        if count < 1:
            raise ValueError(f"count must be positive, got {count}")
        request = _Request(count)
        with self._lock:
            self._pending.append(request)
            if not self._in_flight:
                self._in_flight = request.leads = True
        if not request.leads:
            request.done.wait()
        if request.leads:
            self._serve_one_batch()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def next_timestamp(self) -> int:
        return self.next_range(1).first

    def _serve_one_batch(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        try:
            self.calls += 1
            got = self._fetch(sum(r.count for r in batch))
        except BaseException as exc:  # every waiter of this batch sees the failure
            for r in batch:
                r.error = exc
        else:
            offset = got.first
            for r in batch:
                r.result = TimestampRange(offset, r.count)
                offset += r.count
        with self._lock:
            # Hand the next call to the oldest waiter, so that no caller serves
            # other callers' batches for longer than its own call.
            if self._pending:
                successor = self._pending[0]
                successor.leads = True
                successor.done.set()
            else:
                self._in_flight = False
        for r in batch:
            r.done.set()
