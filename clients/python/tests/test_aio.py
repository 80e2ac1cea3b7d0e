"""What only the asyncio client has: coroutines, concurrency on one channel,
cancellation, `async with`. Its behaviour per call is checked by the shared
tests (test_client.py, test_errors.py, test_parity.py run against both)."""

from __future__ import annotations

import asyncio
import inspect
import socket

import grpc
import grpc.aio
import pytest

import oncegate
import oncegate.aio
from conftest import free_port
from oncegate import Outcome, Unavailable

TS = "2026-11-29T10:57:45Z"
RPCS = ("submit", "submit_batch", "lookup", "health", "begin", "complete", "release")


def test_same_methods_and_signatures_as_the_sync_client():
    sync_public = {n for n in dir(oncegate.Gate) if not n.startswith("_")}
    aio_public = {n for n in dir(oncegate.aio.Gate) if not n.startswith("_")}
    assert sync_public == aio_public == {*RPCS, "close", "effect"}
    # The same parameters; the sync one is a context manager, the aio one an async one.
    assert inspect.signature(oncegate.Gate.effect).parameters == inspect.signature(oncegate.aio.Gate.effect).parameters
    for name in (*RPCS, "close"):
        sync_m, aio_m = getattr(oncegate.Gate, name), getattr(oncegate.aio.Gate, name)
        assert inspect.iscoroutinefunction(aio_m), name
        assert not inspect.iscoroutinefunction(sync_m), name
        assert inspect.signature(sync_m) == inspect.signature(aio_m), name
    assert inspect.signature(oncegate.Gate.__init__) == inspect.signature(oncegate.aio.Gate.__init__)
    # One set of types and exceptions.
    for name in ("Decision", "Submission", "GateError", "Unavailable", "KeyReused", "LeaseLost", "ServingStatus", "Acquired", "Completed"):
        assert getattr(oncegate.aio, name) is getattr(oncegate, name)


@pytest.mark.sidecar
def test_concurrent_deliveries_of_one_key_claim_once(sidecar, unique):
    async def main():
        async with oncegate.aio.Gate(sidecar.target, timeout=30) as gate:
            same = [gate.submit(f"AWD-{unique}", TS, b"one", 700) for _ in range(25)]
            distinct = [gate.submit(f"AWD-{unique}-d", TS, f"{n}".encode(), 100 + n) for n in range(25)]
            return await asyncio.gather(*same), await asyncio.gather(*distinct)

    same, distinct = asyncio.run(main())
    assert sorted(d.outcome.value for d in same) == ["CLAIMED"] + ["DUPLICATE"] * 24
    assert len({d.disbursement for d in same}) == 1  # every answer: the one stored result
    assert all(d.outcome is Outcome.CLAIMED for d in distinct)
    assert sorted(d.disbursement.sequence for d in distinct) == list(range(1, 26))


def test_cancelling_a_task_cancels_the_call_not_a_gate_error():
    async def main(target):
        async with oncegate.aio.Gate(target, timeout=30) as gate:
            task = asyncio.create_task(gate.submit("A", TS, b"x", 1))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    # Accepts TCP and never speaks HTTP/2: the call stays pending until cancelled.
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(16)
        asyncio.run(asyncio.wait_for(main(f"127.0.0.1:{black_hole.getsockname()[1]}"), 20))


def test_unavailable_cause_is_the_aio_rpc_error():
    async def main():
        async with oncegate.aio.Gate(f"127.0.0.1:{free_port()}", timeout=5) as gate:
            with pytest.raises(Unavailable) as info:
                await gate.lookup("0" * 64)
        return info.value

    err = asyncio.run(main())
    assert isinstance(err.__cause__, grpc.aio.AioRpcError)


@pytest.mark.sidecar
def test_a_channel_of_your_own_is_left_open(sidecar, unique):
    async def main():
        channel = grpc.aio.insecure_channel(sidecar.target)
        async with oncegate.aio.Gate(channel=channel) as gate:
            claimed = await gate.submit(f"AWD-{unique}", TS, b"own channel", 5)
        # Closing the client did not close the caller's channel.
        async with oncegate.aio.Gate(channel=channel) as again:
            duplicate = await again.submit(f"AWD-{unique}", TS, b"own channel", 5)
        await channel.close()
        return claimed, duplicate

    claimed, duplicate = asyncio.run(main())
    assert claimed.claimed and duplicate.duplicate
    assert duplicate.disbursement == claimed.disbursement
