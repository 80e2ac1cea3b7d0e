#!/usr/bin/env python3
"""A Kafka consumer with exactly-once effect through the oncegate sidecar (confluent-kafka).

The loop (DESIGN.md §1):

    poll  ->  Gate.submit  ->  commit the offset only after CLAIMED or DUPLICATE

* `isolation.level=read_committed` (only committed transactions are read, so
  the oncegate relay's Kafka transactions come through exactly once) and
  `enable.auto.commit=false`: an offset is committed only once the message is
  decided. If this process dies before the commit, the message is read again
  (here or, after a rebalance, by another member) and the sidecar answers
  DUPLICATE.
* A message error (malformed body, InvalidSubmission, KeyReused): retrying can
  never succeed. The message is produced to the dead-letter topic (its key,
  value and headers, plus `oncegate_error` and `oncegate_error_message`) and
  its offset is committed *in the same Kafka transaction*, so a
  read_committed reader of the dead-letter topic sees each poison message
  exactly once even when this process is killed mid-way. The sidecar wrote
  nothing for it.
* A retryable error (sidecar or its store down, overloaded, deadline passed):
  no commit. The partition is rewound to the message (seek) and paused for a
  backoff, then resumed; the other partitions go on meanwhile.
* Offsets are committed after every decision, or every --commit-every
  decisions. Rebalance: a revoked partition's decided offsets are committed
  first, its backoff state dropped; whatever was not decided (or decided but
  not committed, when the process was killed) is read again by the new owner
  and answered DUPLICATE.
* SIGTERM/SIGINT: finish the message in hand, leave the group, exit 0.

Messages: the JSON body of the RabbitMQ and Redis Streams examples (award_id,
submission_timestamp, amount_cents, payload base64, optional
idempotency_key). The oncegate relay's own events on Kafka (key = award id,
value = the disbursement.recorded event JSON, headers event_id/event_type)
are a downstream record, not a submission: they carry no
submission_timestamp or payload, and this consumer would dead-letter them as
MALFORMED. A message's `message_id` header (or `event_id`) is echoed in the
output lines. Each handled message (decided or dead-lettered) is printed to
stdout as one JSON line, before its offset is committed; and before each
offset commit (a commit of decided offsets, or a dead letter's transaction) a
line `{"consumer": …, "commit": [[partition, next offset], …]}` says what is
about to be committed: a line printed after the last commit line covering its
partition was not committed (the message is read again after a crash). A
commit that fails is logged, and its messages are read again. Logs go to
stderr. Payloads are never logged.

    python kafka_consumer.py --bootstrap-servers kafka:9092 --topic grants \\
        --group grants-workers --dead-letter-topic grants.dead --consumer "$POD_NAME"
"""

from __future__ import annotations

import argparse
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

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from oncegate import Gate, GateError, Submission

log = logging.getLogger("oncegate.kafka")

# The body of the RabbitMQ example, parsed the same way.
_INTEGER = re.compile(r"-?[0-9]+")


class MalformedMessage(ValueError):
    pass


def header(msg: Message, name: str) -> str | None:
    """A record header as text (the producer's W3C ``traceparent``, say)."""
    for key, value in msg.headers() or []:
        if key == name and value:
            return value.decode("ascii", "replace")
    return None


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




class KafkaGateConsumer:
    def __init__(self, gate: Gate, args: argparse.Namespace):
        self.gate = gate
        self.a = args
        self.stopping = False
        self.paused: dict[tuple[str, int], float] = {}  # (topic, partition) -> resume at
        self.failures: dict[tuple[str, int], int] = {}
        self.decided: dict[tuple[str, int], int] = {}  # next offset to commit, decided not yet committed
        self.since_commit = 0
        common = {"bootstrap.servers": args.bootstrap_servers, "client.id": args.consumer}
        self.consumer = Consumer({
            **common,
            "group.id": args.group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": int(args.session_timeout * 1000),
            "heartbeat.interval.ms": max(int(args.session_timeout * 1000) // 4, 100),
        })
        # Dead letters go out in a transaction together with the offset commit.
        # One transactional id per consumer name: a restarted consumer of the
        # same name fences its predecessor and aborts what it left open.
        self.producer = Producer({
            **common,
            "transactional.id": f"{args.group}.dead-letter.{args.consumer}",
            "transaction.timeout.ms": 10000,
        })
        self.producer.init_transactions(30)

    def stop(self, *_: object) -> None:
        if not self.stopping:
            log.info("stopping: finishing the message in hand")
        self.stopping = True

    # -- rebalance -----------------------------------------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", [p.partition for p in partitions])

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what was decided on these partitions; forget backoff state.
        # The next owner reads the undecided ones.
        log.info("revoked %s", [p.partition for p in partitions])
        self.commit_decided({(p.topic, p.partition) for p in partitions})
        for p in partitions:
            self.paused.pop((p.topic, p.partition), None)
            self.failures.pop((p.topic, p.partition), None)

    # -- handling --------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        tp = (msg.topic(), msg.partition())
        try:
            submission = parse_body(msg.value() or b"")
        except MalformedMessage as exc:
            self.dead_letter(msg, "MALFORMED", str(exc))
            return
        try:
            decision = self.gate.submit(submission.award_id, submission.submission_timestamp,
                                        submission.payload, submission.amount_cents,
                                        submission.idempotency_key,
                                        traceparent=header(msg, "traceparent"))
        except GateError as exc:
            if exc.poison:
                self.dead_letter(msg, exc.code.name, exc.message)
                return
            # No commit: rewind this partition to the message and let it wait.
            n = self.failures.get(tp, 0) + 1
            self.failures[tp] = n
            delay = min(0.05 * 2 ** min(n, 7), 5.0)
            part = TopicPartition(msg.topic(), msg.partition(), msg.offset())
            self.consumer.pause([part])
            self.consumer.seek(part)
            self.paused[tp] = time.monotonic() + delay
            log.warning("submit failed, partition %d waits %.2fs at offset %d code=%s",
                        msg.partition(), delay, msg.offset(), exc.code.name)
            self.emit(msg, outcome="ERROR", code=exc.code.name, retryable=exc.retryable)
            return
        # The line goes out before the offset commit: a message whose offset is
        # committed is never read again, so its line must already be printed
        # (killed in between, the message is read again and printed DUPLICATE).
        self.failures.pop(tp, None)
        d = decision.disbursement
        self.emit(msg, outcome=decision.outcome.value, key=decision.idempotency_key,
                  disbursement_id=d.id, sequence=d.sequence,
                  decided_by=decision.decided_by.value)
        self.decided[tp] = msg.offset() + 1
        self.since_commit += 1
        if self.since_commit >= self.a.commit_every:
            self.commit_decided()

    def commit_decided(self, only: set[tuple[str, int]] | None = None) -> bool:
        """Commit the decided offsets (of `only` partitions, or all)."""
        tps = [tp for tp in self.decided if only is None or tp in only]
        if not tps:
            return True
        offsets = [TopicPartition(t, p, self.decided.pop((t, p))) for t, p in tps]
        self.since_commit = 0
        self.emit_commit(offsets)
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
            return True
        except KafkaException as exc:
            # Lost the partition (rebalance) or the broker: the new owner reads
            # those messages again and gets DUPLICATE.
            log.warning("commit failed %s: %s", [(o.partition, o.offset) for o in offsets], exc)
            return False

    def dead_letter(self, msg: Message, code: str, reason: str) -> None:
        headers = list(msg.headers() or []) + [("oncegate_error", code.encode()),
                                               ("oncegate_error_message", reason.encode()),
                                               ("oncegate_source", f"{msg.topic()}/{msg.partition()}/{msg.offset()}".encode())]
        offsets = [TopicPartition(msg.topic(), msg.partition(), msg.offset() + 1)]
        # As for a decision: the message's line, then the commit line, then
        # the commit (here the transaction). Killed after the commit, the
        # line is already out; killed before it, the message is read again
        # and dead-lettered again (the aborted transaction's copy is never
        # seen by a read_committed reader).
        self.emit(msg, outcome="DEAD_LETTER", code=code, message=reason)
        self.emit_commit(offsets)
        try:
            self.producer.begin_transaction()
            self.producer.produce(self.a.dead_letter_topic, key=msg.key(), value=msg.value(), headers=headers)
            self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), 30)
            self.producer.commit_transaction(30)
            self.decided.pop((msg.topic(), msg.partition()), None)  # committed past them
        except KafkaException as exc:
            log.warning("dead-letter transaction failed partition=%d offset=%d, read again: %s",
                        msg.partition(), msg.offset(), exc)
            try:
                self.producer.abort_transaction(30)
            except KafkaException:
                pass
            # Not committed: read it again.
            part = TopicPartition(msg.topic(), msg.partition(), msg.offset())
            try:
                self.consumer.seek(part)
            except KafkaException:
                pass
            return
        log.error("dead-lettered partition=%d offset=%d code=%s reason=%s",
                  msg.partition(), msg.offset(), code, reason)

    def emit_commit(self, offsets: list[TopicPartition]) -> None:
        """The commit line: printed before the commit is sent, so every
        decision printed after it (on its partitions) is certainly not covered
        by it."""
        line = {"consumer": self.a.consumer, "commit": [[o.partition, o.offset] for o in offsets]}
        print(json.dumps(line), flush=True)

    def emit(self, msg: Message, **fields) -> None:
        headers = {k: v.decode(errors="replace") for k, v in (msg.headers() or []) if v is not None}
        line = {"consumer": self.a.consumer, "partition": msg.partition(), "offset": msg.offset(),
                "message_id": headers.get("message_id") or headers.get("event_id"), **fields}
        print(json.dumps(line), flush=True)

    # -- the loop ----------------------------------------------------------------

    def resume_due(self) -> None:
        now = time.monotonic()
        due = [tp for tp, at in self.paused.items() if at <= now]
        if due:
            self.consumer.resume([TopicPartition(t, p) for t, p in due])
            for tp in due:
                del self.paused[tp]

    def run(self) -> int:
        self.consumer.subscribe([self.a.topic], on_assign=self.on_assign, on_revoke=self.on_revoke,
                                on_lost=self.on_revoke)
        log.info("consuming topic=%s group=%s", self.a.topic, self.a.group)
        try:
            while not self.stopping:
                self.resume_due()
                msg = self.consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("consumer error: %s", msg.error())
                    continue
                if (msg.topic(), msg.partition()) in self.paused:
                    continue  # fetched before the pause took hold; it is read again
                self.handle(msg)
                if self.a.max_rate > 0:
                    time.sleep(1.0 / self.a.max_rate)
            self.commit_decided()
        finally:
            self.consumer.close()  # leaves the group: its partitions move at once
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Kafka -> oncegate -> offset commit consumer")
    p.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True, help="consumer group id")
    p.add_argument("--dead-letter-topic", help="default: <topic>.dead")
    p.add_argument("--target", default=os.environ.get("ONCEGATE_TARGET", "127.0.0.1:50051"),
                   help="oncegate sidecar gRPC address")
    p.add_argument("--consumer", default=f"{socket.gethostname()}-{os.getpid()}",
                   help="member name (client.id; also names the dead-letter transactional id)")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline per Submit, seconds")
    p.add_argument("--session-timeout", type=float, default=10.0,
                   help="group session timeout, seconds (a killed member's partitions move after it)")
    p.add_argument("--commit-every", type=int, default=1,
                   help="commit decided offsets after this many decisions (and on revoke and stop)")
    p.add_argument("--max-rate", type=float, default=0.0, help="messages per second (0: unlimited)")
    args = p.parse_args(argv)
    if args.commit_every < 1:
        p.error("--commit-every must be at least 1")
    args.dead_letter_topic = args.dead_letter_topic or f"{args.topic}.dead"

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with Gate(args.target, timeout=args.timeout) as gate:
        consumer = KafkaGateConsumer(gate, args)
        signal.signal(signal.SIGTERM, consumer.stop)
        signal.signal(signal.SIGINT, consumer.stop)
        return consumer.run()


if __name__ == "__main__":
    sys.exit(main())
