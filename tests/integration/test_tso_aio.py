"""The asyncio timestamp client against a real ``percolake serve`` process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ServerProcess
from tso.aio import AsyncTimestampSource
from wire.error_codes import ServiceUnavailableError, UnauthenticatedError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        "all", ["--store", "memory://"], tmp_path_factory.mktemp("aio"), env={"PERCOLAKE_TOKEN": ""}
    ).start()
    yield server
    server.stop()


def test_concurrent_coroutines_get_distinct_increasing_timestamps(oracle: ServerProcess) -> None:
    async def run() -> list[list[int]]:
        async with AsyncTimestampSource(oracle.address) as source:

            async def caller(slot: int) -> list[int]:
                got: list[int] = []
                for n in range(40):
                    if (slot + n) % 5 == 0:
                        r = await source.next_range(3)
                        got += range(r.first, r.first + r.count)
                    else:
                        got.append(await source.next_timestamp())
                return got

            return await asyncio.gather(*(caller(i) for i in range(64)))

    per_caller = asyncio.run(run())
    for got in per_caller:
        assert got == sorted(got) and len(set(got)) == len(got)
    everything = [t for got in per_caller for t in got]
    assert len(everything) == len(set(everything)) == sum(len(g) for g in per_caller)


def test_later_calls_get_larger_timestamps(oracle: ServerProcess) -> None:
    async def run() -> tuple[int, int]:
        async with AsyncTimestampSource(oracle.address) as source:
            first = await source.next_timestamp()
            return first, await source.next_timestamp()

    first, second = asyncio.run(run())
    assert second > first
    again, _ = asyncio.run(run())
    assert again > second


def test_bad_counts_are_refused_before_any_call(oracle: ServerProcess) -> None:
    async def run(count: object) -> None:
        async with AsyncTimestampSource(oracle.address) as source:
            await source.next_range(count)  # type: ignore[arg-type]

    for count, error, words in (
        (0, ValueError, "count must be in 1..1000000, got 0"),
        (1_000_001, ValueError, "got 1000001"),
        (True, TypeError, "count must be int, got bool"),
        ("3", TypeError, "count must be int, got str"),
    ):
        with pytest.raises(error, match=words):
            asyncio.run(run(count))


def test_a_wrong_token_and_a_dead_oracle_raise_the_errors_they_stand_for(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    server = ServerProcess(
        "tso", ["--store", "memory://", "--token-file", str(token_file)], tmp_path
    ).start()

    async def one(token: str | None, timeout_s: float = 10.0) -> int:
        async with AsyncTimestampSource(server.address, token=token, timeout_s=timeout_s) as source:
            return await source.next_timestamp()

    try:
        with pytest.raises(UnauthenticatedError):
            asyncio.run(one("wrong"))
        assert asyncio.run(one("s3cret")) > 0
    finally:
        server.stop()
    with pytest.raises(ServiceUnavailableError):
        asyncio.run(one("s3cret", timeout_s=2.0))
