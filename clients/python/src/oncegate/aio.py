"""The asyncio client: :class:`oncegate.Gate` on ``grpc.aio``.

Same methods, arguments, return types and exceptions as the synchronous
client, each a coroutine::

    from oncegate.aio import Gate
    from oncegate import GateError

    async with Gate("127.0.0.1:50051") as gate:
        decision = await gate.submit(award_id=..., submission_timestamp=...,
                                     payload=..., amount_cents=...)
        # ack the broker now (CLAIMED or DUPLICATE); on GateError do not ack.

Create the client inside a running event loop (a ``grpc.aio`` channel belongs
to the loop it was made on). One client serves any number of concurrent
calls; cancelling a task cancels its call (the sidecar still finishes a
transaction it has started, and the redelivery learns the outcome).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

import grpc
import grpc.aio

from . import _common
from ._common import DEFAULT_TARGET, DEFAULT_TIMEOUT, BatchItem, Effect
from .errors import (
    DeadlineExceeded,
    GateError,
    InvalidSubmission,
    KeyReused,
    LeaseLost,
    ResourceExhausted,
    Retryable,
    TooLarge,
    Unavailable,
    effect_error,
    from_rpc_error,
)
from .key import Payload
from .types import Acquired, Completed, Decision, Disbursement, Outcome, ServingStatus, Submission, Tier

__all__ = [
    "Gate",
    "DEFAULT_TARGET",
    "DEFAULT_TIMEOUT",
    # The same types and exceptions as `oncegate`, for one-import use.
    "Acquired",
    "Completed",
    "Decision",
    "Disbursement",
    "Outcome",
    "ServingStatus",
    "Submission",
    "Tier",
    "GateError",
    "InvalidSubmission",
    "KeyReused",
    "LeaseLost",
    "Retryable",
    "Unavailable",
    "ResourceExhausted",
    "TooLarge",
    "DeadlineExceeded",
]


class Gate(_common.GateBase):
    """Asyncio client for ``oncegate.v1.Gate``; see :class:`oncegate.Gate`.

    ``Gate(target="127.0.0.1:50051", *, channel=None, credentials=None,
    timeout=10.0, options=None)``; ``channel`` is a ``grpc.aio.Channel``.
    Use ``async with``, or ``await gate.close()``.
    """

    _grpc = grpc.aio

    # -- RPCs ---------------------------------------------------------------

    async def submit(
        self,
        award_id: str,
        submission_timestamp: str,
        payload: Payload,
        amount_cents: int,
        idempotency_key: str | None = None,
        *,
        timeout: float | None = None,
        traceparent: str | None = None,
    ) -> Decision:
        """Decide one delivery. Returns CLAIMED or DUPLICATE; raises GateError.

        ``traceparent`` (W3C) is the trace to continue; without it the current
        OpenTelemetry context is sent when ``opentelemetry`` is installed."""
        request = _common.submit_request(
            award_id, submission_timestamp, payload, amount_cents, idempotency_key
        )
        metadata = _common.trace_metadata(traceparent)
        return _common.decision(await self._call(self._stub.Submit, request, timeout, metadata))

    async def submit_batch(
        self,
        submissions: Iterable[BatchItem],
        *,
        timeout: float | None = None,
        traceparent: str | None = None,
    ) -> list[Decision | GateError]:
        """One result per item, in order; a per-item failure is *returned* as a
        GateError instance, a failure of the whole call is raised."""
        request = _common.submit_batch_request(submissions)
        metadata = _common.trace_metadata(traceparent)
        return _common.batch_results(await self._call(self._stub.SubmitBatch, request, timeout, metadata))

    async def lookup(self, idempotency_key: str, *, timeout: float | None = None) -> Decision | None:
        """The stored result for a key (outcome DUPLICATE), or None if not found."""
        request = _common.lookup_request(idempotency_key)
        return _common.lookup_result(await self._call(self._stub.Lookup, request, timeout))

    async def health(self, service: str = "", *, timeout: float | None = None) -> ServingStatus:
        """``grpc.health.v1.Health/Check`` (``""``: the whole server)."""
        request = _common.health_request(service)
        return _common.serving_status(await self._call(self._health_check, request, timeout))

    # -- Effects (DESIGN §9) -------------------------------------------------

    async def begin(
        self,
        namespace: str,
        idempotency_key: str,
        request: Payload,
        *,
        lease_ttl: float | None = None,
        timeout: float | None = None,
    ) -> Acquired | Completed:
        """``Effects.Begin``: the lease (Acquired) or the stored response
        (Completed). Waits, up to ``timeout``, for a lease held elsewhere."""
        req = _common.begin_request(namespace, idempotency_key, request, lease_ttl)
        return _common.begin_result(await self._effect_call(self._effects.Begin, req, timeout))

    async def complete(
        self,
        namespace: str,
        idempotency_key: str,
        lease_token: str,
        response: Payload,
        *,
        timeout: float | None = None,
    ) -> str:
        """``Effects.Complete``: commits the response; returns completed_at.
        Raises LeaseLost when the token's lease was taken over."""
        req = _common.complete_request(namespace, idempotency_key, lease_token, response)
        return (await self._effect_call(self._effects.Complete, req, timeout)).completed_at

    async def release(
        self,
        namespace: str,
        idempotency_key: str,
        lease_token: str,
        reason: str = "",
        *,
        timeout: float | None = None,
    ) -> None:
        """``Effects.Release``: the effect certainly did not happen."""
        req = _common.release_request(namespace, idempotency_key, lease_token, reason)
        await self._effect_call(self._effects.Release, req, timeout)

    @contextlib.asynccontextmanager
    async def effect(
        self,
        namespace: str,
        idempotency_key: str,
        request: Payload,
        *,
        lease_ttl: float | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[Effect]:
        """An effect performed at most once (see :class:`oncegate._common.Effect`)::

            async with gate.effect("payments", key, instruction) as fx:
                if fx.acquired:
                    fx.result = await bank.pay(instruction, idempotency_key=key)
            receipt = fx.response
        """
        begun = await self.begin(namespace, idempotency_key, request, lease_ttl=lease_ttl, timeout=timeout)
        fx = Effect(namespace, idempotency_key, begun)
        try:
            yield fx
        except BaseException as exc:
            await self._finish(fx, _common.effect_exit(fx, exc), timeout, exc)
            raise
        await self._finish(fx, _common.effect_exit(fx, None), timeout, None)

    async def _finish(self, fx: Effect, action, timeout: float | None, exc: BaseException | None) -> None:
        if action is None:
            return
        kind, req = action
        try:
            if kind == "complete":
                fx.completed_at = (await self._effect_call(self._effects.Complete, req, timeout)).completed_at
            else:
                await self._effect_call(self._effects.Release, req, timeout)
        except GateError as failed:
            if exc is None:
                raise
            exc.add_note(f"releasing the effect's lease failed too: {failed!r}")

    # -- plumbing -----------------------------------------------------------

    async def _call(self, method, request, timeout: float | None, metadata=None):
        try:
            return await method(request, timeout=self._deadline(timeout), metadata=metadata)
        except grpc.RpcError as exc:  # grpc.aio.AioRpcError
            raise from_rpc_error(exc) from exc

    async def _effect_call(self, method, request, timeout: float | None):
        try:
            return await self._call(method, request, timeout)
        except ResourceExhausted as exc:
            raise effect_error(exc) from exc.__cause__

    async def close(self) -> None:
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> Gate:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
