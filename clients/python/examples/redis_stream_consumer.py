#!/usr/bin/env python3
"""A Redis Streams consumer with exactly-once effect through the oncegate sidecar.

The loop (DESIGN.md §1):

    XREADGROUP  ->  Gate.submit  ->  XACK only after CLAIMED or DUPLICATE

* A retryable error (sidecar or its store down, overloaded, deadline passed):
  do not ack. The entry stays in this consumer's pending list; it is retried
  from there (`XREADGROUP ... 0`) and, if this consumer dies, another one takes
  it over with `XAUTOCLAIM` once it has been idle for --claim-min-idle-ms.
  The sidecar answers the redelivery DUPLICATE if the first try committed.
* A message error (InvalidSubmission, KeyReused, malformed entry): retrying
  can never succeed, so the entry is copied to the dead-letter stream and
  acked, atomically (MULTI/EXEC).

Entry fields: award_id, submission_timestamp, amount_cents, payload and an
optional idempotency_key. Each handled entry is printed to stdout as one JSON
line; logs go to stderr.

    python redis_stream_consumer.py --stream grants --group disbursers --consumer pod-a

With --workers N, N consumers named <consumer>-1 … <consumer>-N run in
threads of one process, sharing the sidecar channel and the Redis pool: the
sidecar coalesces their concurrent claims into one transaction (group
commit). On SIGTERM each finishes the entry it is on, acks it, and stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

import redis

from oncegate import Gate, GateError, Submission

log = logging.getLogger("oncegate.consumer")

Entry = tuple[bytes, dict[bytes, bytes] | None]
EMIT_LOCK = threading.Lock()


class MalformedEntry(ValueError):
    pass


def parse_entry(fields: dict[bytes, bytes]) -> Submission:
    try:
        key = fields.get(b"idempotency_key")
        return Submission(
            award_id=fields[b"award_id"].decode("utf-8"),
            submission_timestamp=fields[b"submission_timestamp"].decode("utf-8"),
            payload=fields.get(b"payload", b""),
            amount_cents=int(fields[b"amount_cents"]),
            idempotency_key=key.decode("utf-8") if key else None,
        )
    except KeyError as exc:
        raise MalformedEntry(f"missing field {exc.args[0].decode()}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedEntry(str(exc)) from exc


@dataclass
class Settings:
    stream: str
    group: str
    consumer: str
    dead_letter_stream: str
    count: int = 10
    block_ms: int = 2000
    claim_min_idle_ms: int = 60_000
    claim_interval_s: float = 5.0
    max_deliveries: int = 0  # 0: never give up on retryable errors
    max_rate: float = 0.0  # entries per second, 0: unlimited


class StreamConsumer:
    def __init__(self, r: redis.Redis, gate: Gate, settings: Settings):
        self.r = r
        self.gate = gate
        self.s = settings
        self.stopping = False
        # Start with this consumer's own pending entries (a restart under the
        # same name), and go back to them after every error.
        self.check_backlog = True
        self.next_claim = 0.0
        self.failures = 0
        self.last_entry_at = 0.0

    def ensure_group(self) -> None:
        try:
            self.r.xgroup_create(self.s.stream, self.s.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- reading ------------------------------------------------------------

    def reclaim(self) -> list[Entry]:
        """Take over entries idle for too long, including a dead consumer's."""
        entries: list[Entry] = []
        cursor = "0-0"
        while len(entries) < self.s.count:
            cursor, claimed, *_deleted = self.r.xautoclaim(
                self.s.stream, self.s.group, self.s.consumer,
                min_idle_time=self.s.claim_min_idle_ms, start_id=cursor,
                count=self.s.count - len(entries),
            )
            entries.extend(claimed)
            if cursor in (b"0-0", "0-0"):
                break
        return entries

    def read(self, entry_id: str, block: int | None) -> list[Entry]:
        reply = self.r.xreadgroup(
            self.s.group, self.s.consumer, {self.s.stream: entry_id},
            count=self.s.count, block=block,
        )
        return reply[0][1] if reply else []

    def next_batch(self) -> tuple[list[Entry], bool]:
        """Entries to handle and whether they are redeliveries."""
        now = time.monotonic()
        if now >= self.next_claim:
            self.next_claim = now + self.s.claim_interval_s
            claimed = self.reclaim()
            if claimed:
                log.info("reclaimed idle entries count=%d", len(claimed))
                return claimed, True
        if self.check_backlog:
            backlog = self.read("0", None)
            if backlog:
                return backlog, True
            self.check_backlog = False
        return self.read(">", self.s.block_ms), False

    # -- handling -----------------------------------------------------------

    def delivery_counts(self, entries: list[Entry]) -> dict[bytes, int]:
        ids = sorted((e[0] for e in entries), key=lambda i: tuple(map(int, i.split(b"-"))))
        pending = self.r.xpending_range(
            self.s.stream, self.s.group, min=ids[0], max=ids[-1],
            count=len(ids) + 100, consumername=self.s.consumer,
        )
        return {p["message_id"]: p["times_delivered"] for p in pending}

    def handle_batch(self, entries: list[Entry], redelivered: bool) -> None:
        counts = self.delivery_counts(entries) if redelivered and self.s.max_deliveries else {}
        for entry_id, fields in entries:
            if self.stopping:
                return
            self.pace()
            if not fields:  # trimmed or deleted from the stream meanwhile
                self.r.xack(self.s.stream, self.s.group, entry_id)
                continue
            if counts.get(entry_id, 0) > self.s.max_deliveries > 0:
                self.dead_letter(entry_id, fields, "MAX_DELIVERIES",
                                 f"delivered {counts[entry_id]} times without a decision")
                continue
            if not self.handle(entry_id, fields):
                return  # the sidecar is in trouble: back off, keep the rest pending

    def handle(self, entry_id: bytes, fields: dict[bytes, bytes]) -> bool:
        try:
            submission = parse_entry(fields)
        except MalformedEntry as exc:
            self.dead_letter(entry_id, fields, "MALFORMED", str(exc))
            return True
        try:
            decision = self.gate.submit(
                award_id=submission.award_id,
                submission_timestamp=submission.submission_timestamp,
                payload=submission.payload,
                amount_cents=submission.amount_cents,
                idempotency_key=submission.idempotency_key,
                # The producer's trace (W3C), continued by the sidecar and
                # carried on to the disbursement event it records.
                traceparent=(fields.get(b"traceparent") or b"").decode("ascii", "replace") or None,
            )
        except GateError as exc:
            if exc.poison:
                self.dead_letter(entry_id, fields, exc.code.name, exc.message)
                return True
            # Do not ack: the entry stays pending and is redelivered.
            self.failures += 1
            delay = min(0.05 * 2 ** min(self.failures, 7), 5.0)
            log.warning("submit failed, not acking entry=%s code=%s retryable=%s retry_in=%.2fs",
                        entry_id.decode(), exc.code.name, exc.retryable, delay)
            self.emit(entry_id, outcome="ERROR", code=exc.code.name, retryable=exc.retryable)
            self.check_backlog = True
            self.sleep(delay)
            return False
        # Commit first (the sidecar did), ack second.
        self.r.xack(self.s.stream, self.s.group, entry_id)
        self.failures = 0
        d = decision.disbursement
        self.emit(entry_id, outcome=decision.outcome.value, key=decision.idempotency_key,
                  disbursement_id=d.id, sequence=d.sequence,
                  decided_by=decision.decided_by.value)
        return True

    def dead_letter(self, entry_id: bytes, fields: dict[bytes, bytes], code: str, message: str) -> None:
        """Copy the entry to the dead-letter stream and ack it, atomically."""
        dead = dict(fields)
        dead.update({b"dead_letter_source_id": entry_id, b"dead_letter_code": code.encode(),
                     b"dead_letter_message": message.encode(), b"dead_letter_consumer": self.s.consumer.encode()})
        with self.r.pipeline(transaction=True) as tx:
            tx.xadd(self.s.dead_letter_stream, dead)
            tx.xack(self.s.stream, self.s.group, entry_id)
            tx.execute()
        log.error("dead-lettered entry=%s code=%s message=%s", entry_id.decode(), code, message)
        self.emit(entry_id, outcome="DEAD_LETTER", code=code, message=message)

    def emit(self, entry_id: bytes, **fields) -> None:
        line = json.dumps({"consumer": self.s.consumer, "entry_id": entry_id.decode(), **fields})
        with EMIT_LOCK:  # whole lines, also from several --workers
            print(line, flush=True)

    # -- loop ---------------------------------------------------------------

    def pace(self) -> None:
        if self.s.max_rate > 0:
            wait = self.last_entry_at + 1.0 / self.s.max_rate - time.monotonic()
            if wait > 0:
                self.sleep(wait)
            self.last_entry_at = time.monotonic()

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(0.05, end - time.monotonic()))

    def drained(self) -> bool:
        return self.r.xpending(self.s.stream, self.s.group)["pending"] == 0

    def run(self, exit_when_drained: bool = False, max_seconds: float = 0) -> int:
        self.ensure_group()
        deadline = time.monotonic() + max_seconds if max_seconds else None
        while not self.stopping:
            if deadline and time.monotonic() >= deadline:
                log.info("stopping after --max-seconds")
                break
            try:
                entries, redelivered = self.next_batch()
                if entries:
                    self.handle_batch(entries, redelivered)
                elif exit_when_drained and self.drained():
                    log.info("stream drained: nothing new, nothing pending")
                    break
                elif exit_when_drained:
                    # Someone else's pending entries are not idle long enough
                    # to claim yet: look again soon.
                    self.next_claim = min(self.next_claim, time.monotonic() + 0.2)
            except redis.ConnectionError as exc:
                log.warning("redis unavailable, retrying: %s", exc)
                self.sleep(1.0)
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Redis Streams -> oncegate -> XACK consumer")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    p.add_argument("--target", default=os.environ.get("ONCEGATE_TARGET", "127.0.0.1:50051"),
                   help="oncegate sidecar gRPC address")
    p.add_argument("--stream", required=True)
    p.add_argument("--group", default="oncegate")
    p.add_argument("--consumer", default=f"{socket.gethostname()}-{os.getpid()}",
                   help="consumer name; reuse it across restarts of the same pod")
    p.add_argument("--dead-letter-stream", help="default: <stream>:dead")
    p.add_argument("--count", type=int, default=10, help="entries per XREADGROUP")
    p.add_argument("--block-ms", type=int, default=2000)
    p.add_argument("--claim-min-idle-ms", type=int, default=60_000,
                   help="XAUTOCLAIM entries pending longer than this (a dead consumer's)")
    p.add_argument("--claim-interval", type=float, default=5.0, help="seconds between XAUTOCLAIM sweeps")
    p.add_argument("--max-deliveries", type=int, default=0,
                   help="dead-letter an entry redelivered more often than this (0: never)")
    p.add_argument("--max-rate", type=float, default=0.0, help="entries per second (0: unlimited)")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline per Submit, seconds")
    p.add_argument("--workers", type=int, default=1,
                   help="consumers in this process, named <consumer>-1 … (1: just <consumer>)")
    p.add_argument("--exit-when-drained", action="store_true",
                   help="exit once there is nothing new and nothing pending in the group")
    p.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: run forever)")
    args = p.parse_args(argv)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings(
        stream=args.stream, group=args.group, consumer=args.consumer,
        dead_letter_stream=args.dead_letter_stream or f"{args.stream}:dead",
        count=args.count, block_ms=args.block_ms, claim_min_idle_ms=args.claim_min_idle_ms,
        claim_interval_s=args.claim_interval, max_deliveries=args.max_deliveries,
        max_rate=args.max_rate,
    )
    if args.workers < 1:
        p.error("--workers must be at least 1")
    with Gate(args.target, timeout=args.timeout) as gate, redis.Redis.from_url(args.redis_url) as r:
        names = [settings.consumer] if args.workers == 1 else [
            f"{settings.consumer}-{i}" for i in range(1, args.workers + 1)]
        consumers = [StreamConsumer(r, gate, dataclasses.replace(settings, consumer=n)) for n in names]

        def stop(signum, _frame):
            log.info("signal %d: finishing the current entry, then stopping", signum)
            for consumer in consumers:
                consumer.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if len(consumers) == 1:
            return consumers[0].run(exit_when_drained=args.exit_when_drained, max_seconds=args.max_seconds)
        return run_threads(consumers, args.exit_when_drained, args.max_seconds)


def run_threads(consumers: list[StreamConsumer], exit_when_drained: bool, max_seconds: float) -> int:
    """Runs each consumer in its own thread; the main thread stays free for signals."""
    failed: list[BaseException] = []

    def run(consumer: StreamConsumer) -> None:
        try:
            consumer.run(exit_when_drained=exit_when_drained, max_seconds=max_seconds)
        except BaseException as exc:  # noqa: BLE001 - reported below, and the others stop
            log.exception("consumer %s failed", consumer.s.consumer)
            failed.append(exc)
            for other in consumers:
                other.stopping = True

    threads = [threading.Thread(target=run, args=(c,), name=c.s.consumer) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.5)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
