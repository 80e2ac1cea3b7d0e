#!/usr/bin/env python3
"""A RabbitMQ consumer with exactly-once effect through the oncegate sidecar (asyncio).

The loop (DESIGN.md §1):

    basic.deliver  ->  await Gate.submit  ->  basic.ack only after CLAIMED or DUPLICATE

* Manual acks. The prefetch (basic.qos, --prefetch) bounds how many deliveries
  this consumer holds unacked, and so how many Submits run at once.
* A message error (InvalidSubmission, KeyReused, a malformed body): retrying
  can never succeed, so the delivery is rejected without requeue and the
  broker dead-letters it through the queue's dead-letter exchange into the
  dead-letter queue. The sidecar wrote nothing for it.
* A retryable error (sidecar or its store down, overloaded, deadline passed)
  or a deployment error: no ack. The delivery is held for a backoff and then
  nacked with requeue, so it is redelivered (to any consumer); the sidecar
  answers DUPLICATE if the first try committed. If this process dies or its
  connection drops, the broker requeues every unacked delivery by itself.
* A dropped connection is reopened with backoff; acks for deliveries of the
  old connection are lost, and those deliveries come back as DUPLICATEs.

Topology, declared idempotently at start (queue arguments must match an
existing queue's, or the broker refuses the declaration):

    exchange <queue>.dlx (direct, durable)
    queue    <queue>.dead (durable) bound to it with routing key <queue>
    queue    <queue> (durable; quorum by default) with
             x-dead-letter-exchange=<queue>.dlx, x-dead-letter-routing-key=<queue>
             quorum: x-dead-letter-strategy=at-least-once (+ x-overflow=reject-publish,
             which it requires): a dead-lettered message leaves the work queue
             only once the dead-letter queue has it.

Message body: a JSON object with award_id, submission_timestamp,
amount_cents (integer), payload (base64) and an optional idempotency_key —
the fields of the Redis Streams example. Each handled delivery is printed to
stdout as one JSON line; logs go to stderr. Payloads are never logged.

    python rabbitmq_consumer.py --queue grants --consumer "$POD_NAME" --prefetch 20
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue
from aio_pika.exceptions import CONNECTION_EXCEPTIONS

from oncegate import GateError, Submission
from oncegate.aio import Gate

log = logging.getLogger("oncegate.rabbitmq")

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
_INTEGER = re.compile(r"-?[0-9]+")


class MalformedMessage(ValueError):
    pass


def parse_body(body: bytes) -> Submission:
    """The JSON body -> a Submission. Error messages name the field, never
    quote the body."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedMessage(f"body is not JSON (line {exc.lineno} column {exc.colno})") from None
    except (UnicodeDecodeError, ValueError):
        raise MalformedMessage("body is not UTF-8 JSON") from None
    if not isinstance(doc, dict):
        raise MalformedMessage("body is not a JSON object")

    def text(name: str, required: bool = True) -> str | None:
        value = doc.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str):
            raise MalformedMessage(f"field {name}: {'missing' if value is None else 'must be a string'}")
        return value

    amount = doc.get("amount_cents")
    if isinstance(amount, str) and _INTEGER.fullmatch(amount):
        amount = int(amount)
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise MalformedMessage(f"field amount_cents: {'missing' if amount is None else 'must be an integer'}")
    payload = text("payload", required=False) or ""
    try:
        payload_bytes = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedMessage(f"field payload: not base64 ({exc})") from None
    return Submission(
        award_id=text("award_id"),
        submission_timestamp=text("submission_timestamp"),
        payload=payload_bytes,
        amount_cents=amount,
        idempotency_key=text("idempotency_key", required=False),
    )


def trace_header(message: AbstractIncomingMessage) -> str | None:
    """The producer's W3C ``traceparent`` header, if it sent one."""
    value = (message.headers or {}).get("traceparent")
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return value or None


def message_body(s: Submission) -> bytes:
    """The body this consumer reads: what a producer publishes."""
    doc = {
        "award_id": s.award_id,
        "submission_timestamp": s.submission_timestamp,
        "amount_cents": s.amount_cents,
        "payload": base64.b64encode(s.payload_bytes).decode("ascii"),
    }
    if s.idempotency_key is not None:
        doc["idempotency_key"] = s.idempotency_key
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


@dataclass
class Settings:
    amqp_url: str
    queue: str
    consumer: str
    queue_type: str = "quorum"
    dead_letter_exchange: str = ""
    dead_letter_queue: str = ""
    prefetch: int = 10
    max_deliveries: int = 0  # 0: never give up on retryable errors
    max_rate: float = 0.0  # deliveries per second, 0: unlimited

    def __post_init__(self) -> None:
        self.dead_letter_exchange = self.dead_letter_exchange or f"{self.queue}.dlx"
        self.dead_letter_queue = self.dead_letter_queue or f"{self.queue}.dead"


async def declare_topology(channel: AbstractChannel, s: Settings) -> AbstractQueue:
    """The work queue, its dead-letter exchange and dead-letter queue."""
    type_args = {"x-queue-type": s.queue_type}
    dlx = await channel.declare_exchange(s.dead_letter_exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    dead = await channel.declare_queue(s.dead_letter_queue, durable=True, arguments=type_args)
    await dead.bind(dlx, routing_key=s.queue)
    arguments = {
        **type_args,
        "x-dead-letter-exchange": s.dead_letter_exchange,
        "x-dead-letter-routing-key": s.queue,
    }
    if s.queue_type == "quorum":
        arguments.update({"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
    return await channel.declare_queue(s.queue, durable=True, arguments=arguments)


class RabbitConsumer:
    def __init__(self, gate: Gate, settings: Settings):
        self.gate = gate
        self.s = settings
        self.stopping = asyncio.Event()
        self.in_flight = 0
        self.failures = 0
        self.last_delivery_at = time.monotonic()
        self._next_slot = 0.0
        self._pace_lock = asyncio.Lock()

    def stop(self) -> None:
        if not self.stopping.is_set():
            log.info("stopping: no new deliveries, finishing the ones in hand")
        self.stopping.set()

    # -- handling -----------------------------------------------------------

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        # aio-pika runs this as its own task per delivery; the prefetch
        # bounds how many run at once.
        self.in_flight += 1
        self.last_delivery_at = time.monotonic()
        try:
            await self.handle(message)
        except Exception:  # pragma: no cover - a bug here must not kill the consumer
            log.exception("unexpected error, leaving delivery unacked tag=%s", message.delivery_tag)
        finally:
            self.in_flight -= 1

    async def handle(self, message: AbstractIncomingMessage) -> None:
        await self.pace()
        # Quorum queues count earlier deliveries that were returned.
        earlier = int((message.headers or {}).get("x-delivery-count") or 0)
        if self.s.max_deliveries and earlier >= self.s.max_deliveries:
            await self.dead_letter(message, "MAX_DELIVERIES", f"delivered {earlier + 1} times without a decision")
            return
        try:
            submission = parse_body(message.body)
        except MalformedMessage as exc:
            await self.dead_letter(message, "MALFORMED", str(exc))
            return
        try:
            decision = await self.gate.submit(
                award_id=submission.award_id,
                submission_timestamp=submission.submission_timestamp,
                payload=submission.payload,
                amount_cents=submission.amount_cents,
                idempotency_key=submission.idempotency_key,
                # The producer's trace (W3C), continued by the sidecar.
                traceparent=trace_header(message),
            )
        except GateError as exc:
            if exc.poison:
                await self.dead_letter(message, exc.code.name, exc.message)
                return
            # Do not ack. Hold the delivery for a backoff (so it does not come
            # straight back), then hand it back to the broker.
            self.failures += 1
            delay = min(0.05 * 2 ** min(self.failures, 7), 5.0)
            log.warning("submit failed, not acking tag=%s code=%s retryable=%s retry_in=%.2fs",
                        message.delivery_tag, exc.code.name, exc.retryable, delay)
            self.emit(message, outcome="ERROR", code=exc.code.name, retryable=exc.retryable)
            await self.sleep(delay)
            await self.settle(message, message.nack(requeue=True), "nack")
            return
        # Commit first (the sidecar did), ack second.
        acked = await self.settle(message, message.ack(), "ack")
        self.failures = 0
        d = decision.disbursement
        self.emit(message, outcome=decision.outcome.value, key=decision.idempotency_key,
                  disbursement_id=d.id, sequence=d.sequence,
                  decided_by=decision.decided_by.value, acked=acked)

    async def dead_letter(self, message: AbstractIncomingMessage, code: str, reason: str) -> None:
        """Reject without requeue: the broker moves it to the dead-letter queue."""
        rejected = await self.settle(message, message.reject(requeue=False), "reject")
        log.error("dead-lettered tag=%s code=%s reason=%s", message.delivery_tag, code, reason)
        self.emit(message, outcome="DEAD_LETTER", code=code, message=reason, rejected=rejected)

    async def settle(self, message: AbstractIncomingMessage, op, what: str) -> bool:
        """Send ack/nack/reject; False when the channel is gone (the broker
        has requeued the delivery and will deliver it again)."""
        try:
            await op
            return True
        except CONNECTION_EXCEPTIONS as exc:
            log.warning("%s lost with the channel tag=%s: %s", what, message.delivery_tag, type(exc).__name__)
            return False

    def emit(self, delivery: AbstractIncomingMessage, **fields) -> None:
        line = {"consumer": self.s.consumer, "message_id": delivery.message_id,
                "delivery_tag": delivery.delivery_tag, "redelivered": bool(delivery.redelivered), **fields}
        print(json.dumps(line), flush=True)

    async def pace(self) -> None:
        if self.s.max_rate <= 0:
            return
        async with self._pace_lock:
            now = time.monotonic()
            slot = max(now, self._next_slot)
            self._next_slot = slot + 1.0 / self.s.max_rate
        if slot > now:
            await self.sleep(slot - now)

    async def sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    # -- connection ---------------------------------------------------------

    async def session(self, exit_when_drained: bool, deadline: float | None) -> bool:
        """One connection: consume until it drops or we stop. True: stop for good."""
        connection = await aio_pika.connect(
            self.s.amqp_url, timeout=10, client_properties={"connection_name": self.s.consumer})
        lost = asyncio.Event()
        connection.close_callbacks.add(lambda *_: lost.set())
        try:
            channel = await connection.channel()
            channel.close_callbacks.add(lambda *_: lost.set())
            await channel.set_qos(prefetch_count=self.s.prefetch)
            queue = await declare_topology(channel, self.s)
            log.info("consuming queue=%s prefetch=%d broker=%s", self.s.queue, self.s.prefetch, connection)
            self.failures = 0
            tag = await queue.consume(self.on_message, consumer_tag=f"{self.s.consumer}-{os.getpid()}")
            waiters = [asyncio.ensure_future(lost.wait()), asyncio.ensure_future(self.stopping.wait())]
            try:
                while not lost.is_set() and not self.stopping.is_set():
                    await asyncio.wait(waiters, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                    if deadline and time.monotonic() >= deadline:
                        log.info("stopping after --max-seconds")
                        self.stop()
                    elif exit_when_drained and not lost.is_set() and await self.drained(channel):
                        log.info("queue drained: nothing ready, nothing in hand")
                        self.stop()
            finally:
                for w in waiters:
                    w.cancel()
            if lost.is_set():
                log.warning("connection lost; its unacked deliveries go back to the queue")
                return False
            await queue.cancel(tag)  # no new deliveries; finish the ones in hand
            end = time.monotonic() + (self.gate.timeout or 10) + 5
            while self.in_flight and time.monotonic() < end and not lost.is_set():
                await asyncio.sleep(0.02)
            return True
        finally:
            await connection.close()

    async def drained(self, channel: AbstractChannel) -> bool:
        if self.in_flight or time.monotonic() - self.last_delivery_at < 1.0:
            return False
        queue = await channel.declare_queue(self.s.queue, passive=True)
        return queue.declaration_result.message_count == 0 and not self.in_flight

    async def run(self, exit_when_drained: bool = False, max_seconds: float = 0) -> int:
        deadline = time.monotonic() + max_seconds if max_seconds else None
        backoff = 0.5
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                if await self.session(exit_when_drained, deadline):
                    break
            except CONNECTION_EXCEPTIONS as exc:
                log.warning("broker unavailable: %s: %s", type(exc).__name__, exc)
            if time.monotonic() - started > 10:
                backoff = 0.5
            await self.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
        return 0


async def amain(args: argparse.Namespace) -> int:
    settings = Settings(
        amqp_url=args.amqp_url, queue=args.queue, consumer=args.consumer,
        queue_type=args.queue_type, dead_letter_exchange=args.dead_letter_exchange or "",
        dead_letter_queue=args.dead_letter_queue or "", prefetch=args.prefetch,
        max_deliveries=args.max_deliveries, max_rate=args.max_rate,
    )
    async with Gate(args.target, timeout=args.timeout) as gate:
        consumer = RabbitConsumer(gate, settings)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, consumer.stop)
        return await consumer.run(exit_when_drained=args.exit_when_drained, max_seconds=args.max_seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="RabbitMQ -> oncegate -> basic.ack consumer (asyncio)")
    p.add_argument("--amqp-url", default=os.environ.get("AMQP_URL", DEFAULT_AMQP_URL))
    p.add_argument("--target", default=os.environ.get("ONCEGATE_TARGET", "127.0.0.1:50051"),
                   help="oncegate sidecar gRPC address")
    p.add_argument("--queue", required=True)
    p.add_argument("--queue-type", choices=("quorum", "classic"), default="quorum")
    p.add_argument("--dead-letter-exchange", help="default: <queue>.dlx")
    p.add_argument("--dead-letter-queue", help="default: <queue>.dead")
    p.add_argument("--consumer", default=f"{socket.gethostname()}-{os.getpid()}",
                   help="consumer name (the AMQP connection name)")
    p.add_argument("--prefetch", type=int, default=10, help="deliveries held unacked at once (basic.qos)")
    p.add_argument("--max-deliveries", type=int, default=0,
                   help="dead-letter a delivery returned this many times already (quorum "
                        "x-delivery-count; sidecar outages count too; 0: never)")
    p.add_argument("--max-rate", type=float, default=0.0, help="deliveries per second (0: unlimited)")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline per Submit, seconds")
    p.add_argument("--exit-when-drained", action="store_true",
                   help="exit once the queue has nothing ready and this consumer holds nothing")
    p.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: run forever)")
    args = p.parse_args(argv)
    if args.prefetch < 1:
        p.error("--prefetch must be at least 1")

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
