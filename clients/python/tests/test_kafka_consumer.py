"""The Kafka example consumer against a real Kafka broker and a real sidecar.

* Two consumer processes in one group on a 3-partition topic, written by a
  transactional producer: unique submissions, producer duplicates, poison
  messages, and one aborted transaction (which read_committed consumers must
  never see). One member is SIGKILLed twice while it holds decisions whose
  offsets are not yet committed (the harness waits for that state, from the
  consumer's own decision and commit lines, and kills again if a commit
  slipped in between); each such message is read again by a later owner and
  answered DUPLICATE. Afterwards the ledger is exact, no key was CLAIMED
  twice, nothing of the aborted transaction took effect, and a read_committed
  reader of the dead-letter topic finds exactly the poison messages, once
  each, with their error codes.
* A sidecar outage: the partition waits (no commit, seek back, backoff) and
  resumes when the sidecar is back, nothing lost, nothing doubled.

Skipped when no broker is configured (KAFKA_BOOTSTRAP unset and nothing on
127.0.0.1:9092); scripts/test always starts one.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

import pytest

from conftest import PY_ROOT, start_sidecar, subprocess_env
from helpers import random_submission
from oncegate import Gate, Submission

pytestmark = [pytest.mark.sidecar, pytest.mark.kafka]

EXAMPLE = PY_ROOT / "examples" / "kafka_consumer.py"
TS = "2026-11-29T10:57:45Z"


@pytest.fixture(scope="module")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        try:
            socket.create_connection(("127.0.0.1", 9092), timeout=2).close()
        except OSError:
            pytest.skip("no Kafka configured (set KAFKA_BOOTSTRAP; scripts/test starts one)")
        bootstrap = "127.0.0.1:9092"
    from confluent_kafka.admin import AdminClient

    AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20)  # fails loudly if not Kafka
    return bootstrap


def create_topics(bootstrap: str, *specs: tuple[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, n, 1) for name, n in specs]).values():
        f.result(30)


def delete_topics(bootstrap: str, *names: str) -> None:
    from confluent_kafka.admin import AdminClient

    for f in AdminClient({"bootstrap.servers": bootstrap}).delete_topics(list(names)).values():
        try:
            f.result(30)
        except Exception:
            pass


def body_of(s: Submission) -> bytes:
    doc = {"award_id": s.award_id, "submission_timestamp": s.submission_timestamp,
           "amount_cents": s.amount_cents, "payload": base64.b64encode(s.payload_bytes).decode()}
    if s.idempotency_key is not None:
        doc["idempotency_key"] = s.idempotency_key
    return json.dumps(doc, ensure_ascii=False).encode()


def produce(bootstrap: str, topic: str, messages: list[tuple[str, bytes, bytes]], commit: bool = True) -> None:
    """(message_id, key, value) in one transaction, committed or aborted."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"pytest-{uuid.uuid4().hex}"})
    p.init_transactions(30)
    p.begin_transaction()
    for mid, key, value in messages:
        p.produce(topic, key=key, value=value, headers=[("message_id", mid.encode())])
        p.poll(0)
    if commit:
        p.commit_transaction(60)
    else:
        p.flush(30)
        p.abort_transaction(30)


def read_all(bootstrap: str, topic: str, expect: int, timeout: float = 30.0) -> list:
    """Every message of `topic`, read_committed; waits for at least `expect`
    and then for a quiet second."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"pytest-reader-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    found, end, quiet_since = [], time.monotonic() + timeout, None
    try:
        while time.monotonic() < end:
            m = c.poll(0.5)
            if m is not None and not m.error():
                found.append(m)
                quiet_since = None
                continue
            if len(found) >= expect:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 1.5:
                    break
    finally:
        c.close()
    return found


class ConsumerProcess:
    def __init__(self, name: str, args: list[str]):
        self.name = name
        self.lines: list[dict] = []  # its decisions, in order
        self.events: list[dict] = []  # its decisions and commit lines, in order
        self.stderr_lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, str(EXAMPLE), "--consumer", name, *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
        self._threads = [threading.Thread(target=self._out, daemon=True),
                         threading.Thread(target=self._err, daemon=True)]
        for t in self._threads:
            t.start()

    def _out(self):
        for raw in self.process.stdout:
            line = json.loads(raw)
            self.events.append(line)
            if "commit" not in line:
                self.lines.append(line)

    def _err(self):
        for raw in self.process.stderr:
            self.stderr_lines.append(raw.decode(errors="replace").rstrip("\n"))

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL; returns once its output is read to the end."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._threads[0].join(10)

    def uncommitted(self) -> dict[tuple[int, int], dict]:
        """Its decisions (CLAIMED, DUPLICATE) that no commit of its own covers:
        printed after its last commit line for their partition (a commit line
        is printed before the commit is sent, so this never counts a
        committed one)."""
        pending: dict[tuple[int, int], dict] = {}
        for line in list(self.events):
            if "commit" in line:
                for partition, offset in line["commit"]:
                    for k in [k for k in pending if k[0] == partition and k[1] < offset]:
                        del pending[k]
            elif line["outcome"] in ("CLAIMED", "DUPLICATE"):
                pending[(line["partition"], line["offset"])] = line
        return pending

    def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        for t in self._threads:
            t.join(5)
        return code

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.stderr_lines[-n:])


def ledger_count(path) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("select count(*) from disbursements").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def wait_for(cond, timeout: float, what: str, procs=()) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in procs)
    pytest.fail(f"timed out waiting for {what}\n{tails}")


def check_ledger(sidecar, subs) -> None:
    expected_total: dict[str, int] = defaultdict(int)
    expected_count: Counter = Counter()
    for s in subs:
        expected_total[s.award_id] += s.amount_cents
        expected_count[s.award_id] += 1
    with Gate(sidecar.target, timeout=30) as gate:
        for s in subs:
            found = gate.lookup(s.key())
            assert found is not None, f"no decision stored for key {s.key()[:12]}"
            assert (found.disbursement.award_id, found.disbursement.amount_cents) == (s.award_id, s.amount_cents)
    db = sqlite3.connect(f"file:{sidecar.sqlite_path}?mode=ro", uri=True)
    try:
        assert db.execute("select count(*) from disbursements").fetchone()[0] == len(subs)
        ledger = {a: (n, t) for a, n, t in db.execute(
            "select award_id, count(*), sum(amount_cents) from disbursements group by award_id")}
        seqs = defaultdict(list)
        for a, seq in db.execute("select award_id, sequence from disbursements"):
            seqs[a].append(seq)
    finally:
        db.close()
    assert ledger == {a: (expected_count[a], expected_total[a]) for a in expected_total}
    for a, ss in seqs.items():
        assert sorted(ss) == list(range(1, len(ss) + 1)), a


@dataclass
class Kill:
    """A SIGKILL that landed: the victim's decisions not yet committed, and
    how many lines every process had printed when it died (what they print
    from then on is after the kill)."""

    victim: ConsumerProcess
    handled: int
    uncommitted: dict[tuple[int, int], dict]
    marks: dict[int, int]

    def read_again(self, procs: list[ConsumerProcess]) -> dict[str, list[dict]]:
        """Each uncommitted message's decisions by other processes after the kill."""
        ids = {x["message_id"] for x in self.uncommitted.values()}
        again: dict[str, list[dict]] = {mid: [] for mid in ids}
        for p in procs:
            if p is self.victim:
                continue
            for x in p.lines[self.marks.get(id(p), 0):]:
                if x["message_id"] in again:
                    again[x["message_id"]].append(x)
        return again


KILL_ATTEMPTS = 5  # a kill that found every decision committed is repeated, this often at most


def test_kafka_consumers_killed_in_a_group_give_an_exact_ledger_and_dead_letters(
    oncegate_bin, tmp_path, kafka_bootstrap, unique, seed
):
    started = time.monotonic()
    rng = random.Random(seed)
    topic, dlt, group = f"oncegate-test.{unique}", f"oncegate-test.{unique}.dead", f"pytest-{unique}"
    create_topics(kafka_bootstrap, (topic, 3), (dlt, 1))

    awards = [f"AWD-{unique}-{i}" for i in range(6)]
    subs = []
    for i in range(600):
        s = random_submission(rng, award_id=rng.choice(awards))
        s = replace(s, payload=s.payload_bytes[:1024])
        if i % 10 == 0:
            s = replace(s, idempotency_key=str(uuid.uuid4()))
        subs.append(s)
    valid = [(s, body_of(s)) for s in subs] + [(s, body_of(s)) for s in rng.choices(subs, k=100)]
    poison = [(body_of(Submission(awards[0], "yesterday", b"x", 100)), "INVALID_ARGUMENT"),
              (body_of(Submission(awards[1], TS, b"zero", 0)), "INVALID_ARGUMENT"),
              (body_of(Submission(awards[2], "2026-02-30T10:00:00Z", b"y", 5)), "INVALID_ARGUMENT"),
              (b"not json", "MALFORMED"), (b"[1, 2]", "MALFORMED"),
              (json.dumps({"award_id": awards[0], "submission_timestamp": TS, "amount_cents": 1.5}).encode(),
               "MALFORMED")]
    messages = [("valid", s.award_id.encode(), body, s.key()) for s, body in valid]
    messages += [("poison", b"poison", body, code) for body, code in poison]
    rng.shuffle(messages)
    mids = [f"m{i}" for i in range(len(messages))]
    kind_of = {mid: m[0] for mid, m in zip(mids, messages)}
    code_of = {mid: m[3] for mid, m in zip(mids, messages) if m[0] == "poison"}
    aborted = [random_submission(rng, award_id=awards[3]) for _ in range(20)]

    produce(kafka_bootstrap, topic, [(mid, key, body) for mid, (_, key, body, _) in zip(mids, messages)])
    produce(kafka_bootstrap, topic, [(f"aborted{i}", b"a", body_of(s)) for i, s in enumerate(aborted)],
            commit=False)
    t_produced = time.monotonic()

    sidecar = start_sidecar(oncegate_bin, tmp_path / "sidecar")
    procs: list[ConsumerProcess] = []
    try:
        common = ["--bootstrap-servers", kafka_bootstrap, "--topic", topic, "--group", group,
                  "--dead-letter-topic", dlt, "--target", sidecar.target, "--session-timeout", "6",
                  "--max-rate", "40", "--commit-every", "20"]

        def start(name: str) -> ConsumerProcess:
            p = ConsumerProcess(name, common)
            procs.append(p)
            return p

        slots = [start(f"kc-{unique}-a"), start(f"kc-{unique}-b")]
        decided = lambda: sum(1 for p in procs for x in p.lines if x["outcome"] != "ERROR")  # noqa: E731
        kills: list[Kill] = []
        misses = 0
        for round_ in range(2):
            target = decided() + 120
            for attempt in range(KILL_ATTEMPTS):
                victim = slots[0]
                # The state under test: decisions whose offsets are not yet committed.
                wait_for(lambda: decided() >= target and victim.uncommitted(), 60,
                         f"{target} decisions and one of {victim.name} not committed (kill {round_ + 1})", procs)
                victim.kill()
                marks = {id(p): len(p.lines) for p in procs}
                slots[0] = start(victim.name)  # same name: fences its dead-letter transaction
                left = victim.uncommitted()  # final: it is dead, its output read to the end
                if left:
                    kills.append(Kill(victim, len(victim.lines), left, marks))
                    break
                misses += 1  # a commit slipped in between the look and the kill: again
            else:
                pytest.fail(f"{KILL_ATTEMPTS} SIGKILLs of {victim.name} all found every decision committed")
        t_chaos = time.monotonic()
        wait_for(lambda: ledger_count(sidecar.sqlite_path) >= len(subs), 120, "every unique effect", procs)
        wait_for(lambda: all(all(again.values()) for again in (k.read_again(procs) for k in kills)), 120,
                 "every decision not committed at a kill read again", procs)
        dead = read_all(kafka_bootstrap, dlt, len(poison), timeout=60)
        for p in slots:
            assert p.terminate() == 0, f"{p.name} did not stop cleanly on SIGTERM:\n{p.log_tail()}"
        t_done = time.monotonic()

        check_ledger(sidecar, subs)
        with Gate(sidecar.target, timeout=30) as gate:
            for s in aborted:
                assert gate.lookup(s.key()) is None, "a message of an aborted transaction took effect"

        # The dead-letter topic: exactly the poison, once each, with its code.
        got = Counter(m.value() for m in dead)
        assert got == Counter(body for body, _ in poison), f"dead-letter topic {len(dead)} messages: {got}"
        for m in dead:
            h = dict(m.headers())
            mid = h["message_id"].decode()
            assert kind_of[mid] == "poison"
            assert h["oncegate_error"].decode() == code_of[mid], h

        lines = [x for p in procs for x in p.lines]
        claimed = Counter(x["key"] for x in lines if x["outcome"] == "CLAIMED")
        assert not [k for k, n in claimed.items() if n > 1], "a key was CLAIMED twice"
        # A consumer SIGKILLed between the sidecar's answer and its output
        # line loses that CLAIMED line; the message, uncommitted (the line is
        # printed before the offset commit), is read again and answered
        # DUPLICATE (the ledger check above holds either way).
        keys = {s.key() for s in subs}
        assert set(claimed) <= keys
        decided = {x["key"] for x in lines if x["outcome"] in ("CLAIMED", "DUPLICATE")}
        assert decided == keys, "every submission decided by some consumer"
        for x in lines:
            if x["outcome"] == "DEAD_LETTER":
                assert kind_of[x["message_id"]] == "poison" and x["code"] == code_of[x["message_id"]], x
            elif x["outcome"] in ("CLAIMED", "DUPLICATE"):
                assert kind_of[x["message_id"]] == "valid", x
        assert not any(x["message_id"].startswith("aborted") for x in lines)
        assert not [x for x in lines if x["outcome"] == "ERROR"], "sidecar errors in a healthy run"
        # What a killed consumer decided and had not committed is read again
        # by the partition's next owner, and answered DUPLICATE with the key
        # and disbursement the killed one got.
        for k in kills:
            first = {x["message_id"]: x for x in k.uncommitted.values()}
            for mid, again in k.read_again(procs).items():
                for x in again:
                    assert (x["outcome"], x["key"], x["disbursement_id"]) == \
                        ("DUPLICATE", first[mid]["key"], first[mid]["disbursement_id"]), (first[mid], x)
        reread = sum(n - 1 for n in Counter(x["message_id"] for x in lines).values() if n > 1)
        rebalances = sum(sum("assigned" in s for s in p.stderr_lines) for p in procs)
        print(f"kafka: {len(messages)} messages (600 unique, 100 producer duplicates, {len(poison)} poison) "
              f"+ 20 aborted; {len(kills)} SIGKILLs with decisions not committed "
              f"({[len(k.uncommitted) for k in kills]}; handled before: {[k.handled for k in kills]}; "
              f"{misses} kills found all committed and were repeated), "
              f"{rebalances} assignments, {reread} messages read again; outcomes "
              f"{dict(Counter(x['outcome'] for x in lines))}; dead-letter topic {len(dead)}; "
              f"produce {t_produced - started:.1f}s, chaos {t_chaos - t_produced:.1f}s, "
              f"finish {t_done - t_chaos:.1f}s")
    finally:
        for p in procs:
            p.kill()
        sidecar.stop()
        delete_topics(kafka_bootstrap, topic, dlt)


def test_kafka_consumer_prints_each_line_before_the_commit_that_covers_it(oncegate_bin, tmp_path, kafka_bootstrap,
                                                                       unique, seed):
    """The output's rule (README, "A Kafka consumer"): a commit line is printed
    before the commit it announces, and every message's line before the first
    commit line covering it; so a line printed after the last commit line
    covering its partition is not yet committed. It holds for decisions and
    for dead letters alike (a dead letter's line once came after its commit
    line, marked committed: a kill in between lost a committed message's line)."""
    rng = random.Random(seed)
    topic, dlt, group = f"oncegate-test.{unique}", f"oncegate-test.{unique}.dead", f"pytest-{unique}"
    create_topics(kafka_bootstrap, (topic, 1), (dlt, 1))
    valid = [random_submission(rng, award_id=f"AWD-{unique}") for _ in range(3)]
    bodies = [("v0", body_of(valid[0])), ("p0", b"not json"), ("v1", body_of(valid[1])),
              ("d0", body_of(valid[0])), ("p1", body_of(replace(valid[2], amount_cents=0))), ("v2", body_of(valid[2]))]
    sidecar = start_sidecar(oncegate_bin, tmp_path / "sidecar")
    consumer = None
    try:
        produce(kafka_bootstrap, topic, [(mid, b"k", body) for mid, body in bodies])
        consumer = ConsumerProcess(f"kc-{unique}", ["--bootstrap-servers", kafka_bootstrap, "--topic", topic,
                                                    "--group", group, "--dead-letter-topic", dlt,
                                                    "--target", sidecar.target])
        last = len(bodies) - 1
        wait_for(lambda: any(p == 0 and o > last for x in list(consumer.events) for p, o in x.get("commit", [])),
                 60, "a commit line past the last message", [consumer])
        assert consumer.terminate() == 0, consumer.log_tail()
        events = consumer.events
        outcomes = {x["message_id"]: x["outcome"] for x in events if "outcome" in x}
        assert outcomes == {"v0": "CLAIMED", "p0": "DEAD_LETTER", "v1": "CLAIMED", "d0": "DUPLICATE",
                            "p1": "DEAD_LETTER", "v2": "CLAIMED"}, events
        for i, x in enumerate(events):
            if "outcome" not in x:
                continue
            covering = [j for j, c in enumerate(events)
                        if any(p == x["partition"] and o > x["offset"] for p, o in c.get("commit", []))]
            assert covering and covering[0] > i, f"line {i} {x} printed after the commit line covering it: {events}"
        assert all("committed" not in x for x in events), "a line printed before its commit cannot know the commit's fate"
        assert len(read_all(kafka_bootstrap, dlt, 2)) == 2
    finally:
        if consumer is not None:
            consumer.kill()
        sidecar.stop()
        delete_topics(kafka_bootstrap, topic, dlt)


def test_kafka_consumer_waits_out_a_sidecar_outage_without_loss(oncegate_bin, tmp_path, kafka_bootstrap, unique,
                                                               seed):
    rng = random.Random(seed)
    topic, dlt, group = f"oncegate-test.{unique}", f"oncegate-test.{unique}.dead", f"pytest-{unique}"
    create_topics(kafka_bootstrap, (topic, 2), (dlt, 1))
    awards = [f"AWD-{unique}-{i}" for i in range(3)]
    first = [random_submission(rng, award_id=rng.choice(awards)) for _ in range(40)]
    second = [random_submission(rng, award_id=rng.choice(awards)) for _ in range(40)]
    workdir = tmp_path / "sidecar"
    sidecar = start_sidecar(oncegate_bin, workdir)
    consumer = None
    try:
        consumer = ConsumerProcess(f"kc-{unique}", ["--bootstrap-servers", kafka_bootstrap, "--topic", topic,
                                                    "--group", group, "--dead-letter-topic", dlt,
                                                    "--target", sidecar.target, "--timeout", "2"])
        produce(kafka_bootstrap, topic, [(f"f{i}", s.award_id.encode(), body_of(s)) for i, s in enumerate(first)])
        wait_for(lambda: ledger_count(sidecar.sqlite_path) >= len(first), 60, "the first batch", [consumer])

        assert sidecar.stop() == 0
        produce(kafka_bootstrap, topic, [(f"s{i}", s.award_id.encode(), body_of(s)) for i, s in enumerate(second)])
        wait_for(lambda: sum(x["outcome"] == "ERROR" for x in consumer.lines) >= 3, 60,
                 "the consumer to see the outage", [consumer])
        time.sleep(2)
        assert ledger_count(sidecar.sqlite_path) == len(first)
        sidecar = start_sidecar(oncegate_bin, workdir, port=int(sidecar.target.rsplit(":", 1)[1]),
                                metrics_port=int(sidecar.metrics_addr.rsplit(":", 1)[1]))
        wait_for(lambda: ledger_count(sidecar.sqlite_path) >= len(first) + len(second), 90,
                 "the second batch after the outage", [consumer])
        time.sleep(1)
        assert consumer.terminate() == 0
        check_ledger(sidecar, first + second)
        lines = consumer.lines
        errors = [x for x in lines if x["outcome"] == "ERROR"]
        assert all(x["retryable"] for x in errors), errors
        assert {x["message_id"] for x in errors} <= {f"s{i}" for i in range(len(second))}
        claimed = Counter(x["key"] for x in lines if x["outcome"] == "CLAIMED")
        assert sorted(claimed) == sorted(s.key() for s in first + second) and max(claimed.values()) == 1
        assert not [x for x in lines if x["outcome"] == "DEAD_LETTER"], "an outage must not dead-letter"
        print(f"kafka outage: {len(errors)} retryable errors while the sidecar was down, nothing lost")
    finally:
        if consumer is not None:
            consumer.kill()
        sidecar.stop()
        delete_topics(kafka_bootstrap, topic, dlt)
