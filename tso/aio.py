"""Timestamps from a remote oracle for asyncio programs.

:class:`AsyncTimestampSource` batches like the threaded
:class:`tso.timestamp_service.RemoteTimestampSource`: at most one ``GetTimestamps`` call is in
flight, and every coroutine that asks while it is takes its share of the next call's
range. Waking a coroutine costs far less than waking a thread, so many concurrent
callers in one process get several times the threaded client's rate.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

import grpc

from tso._oracle import TimestampRange
from tso.timestamp_service import MAX_RANGE
from wire.auth import TlsConfig, auth_metadata
from wire.channels import DEFAULT_MAX_MESSAGE_BYTES, open_channel
from wire.error_codes import error_from
from wire.v1 import timestamp_pb2 as pb
from wire.v1 import timestamp_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Waiter:
    count: int
    future: asyncio.Future[TimestampRange]


class AsyncTimestampSource:
    """Timestamps for coroutines; use as ``async with AsyncTimestampSource(addr) as ts``."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls: TlsConfig | None = None,
        timeout_s: float = 10.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._channel = open_channel(address, tls, max_message_bytes, aio=True)
        self._metadata = auth_metadata(token)
        self._stub = pb_grpc.TimestampServiceStub(self._channel)
        self._timeout_s = timeout_s
        self._waiting: deque[_Waiter] = deque()
        self._pump: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncTimestampSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def next_timestamp(self) -> int:
        return (await self.next_range(1)).first

    async def next_range(self, count: int) -> TimestampRange:
        """``count`` consecutive timestamps, all above any this source returned before
        the call began."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be int, got {type(count).__name__}")
        if not 1 <= count <= MAX_RANGE:
            raise ValueError(f"count must be in 1..{MAX_RANGE}, got {count}")
        waiter = _Waiter(count, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._serve_waiting())
        return await waiter.future

    async def _serve_waiting(self) -> None:
        """Serve everyone waiting with one call per round, until nobody waits."""
        while self._waiting:
            batch: list[_Waiter] = []
            total = 0
            while self._waiting and total + self._waiting[0].count <= MAX_RANGE:
                waiter = self._waiting.popleft()
                batch.append(waiter)
                total += waiter.count
            try:
                got = await self._stub.GetTimestamps(
                    pb.GetTimestampsRequest(count=total),
                    metadata=self._metadata,
                    timeout=self._timeout_s,
                )
                if got.count != total:
                    raise RuntimeError(f"oracle returned {got.count} timestamps, asked for {total}")
            except grpc.RpcError as err:
                self._fail(batch, error_from(err))
                continue
            except Exception as exc:
                self._fail(batch, exc)
                continue
            first = got.first
            for waiter in batch:
                if not waiter.future.done():  # a cancelled caller's share is skipped
                    waiter.future.set_result(TimestampRange(first, waiter.count))
                first += waiter.count

    @staticmethod
    def _fail(batch: list[_Waiter], exc: Exception) -> None:
        log.debug("GetTimestamps failed for %d waiters: %s", len(batch), exc)
        for waiter in batch:
            if not waiter.future.done():
                waiter.future.set_exception(exc)
