"""The RabbitMQ example consumer under fire, against a real broker and sidecar.

About 2,000 messages on one quorum queue: unique submissions (some with the
producer's own key), producer-side duplicates, submissions the sidecar has
already committed (a consumer that died between commit and ack), and poison
messages (invalid timestamps and amounts, key reuse with a different amount
or payload, malformed bodies). Three consumer processes of the example
(different prefetch) work the queue while the test, at random, SIGKILLs one
that holds unacked deliveries or cuts its connection from the broker side
(`rabbitmqctl close_connection`), and restarts the killed ones. A victim
holds unacked deliveries by construction: it is consuming (it has handled a
delivery in its current session) while more than its prefetch is ready, so
the broker keeps its window full. The chaos goes on until both kinds reached
their count. Afterwards:

  * the ledger is exact: one disbursement per unique valid submission (Lookup
    of every key, and the SQLite store read directly), exact totals and dense
    sequences per award, no key CLAIMED twice;
  * the work queue is empty;
  * exactly the poison messages are in the dead-letter queue, once each.

Skipped when no broker answers at AMQP_URL (default
amqp://guest:guest@127.0.0.1:5672/). Queues and exchange are unique per run
and deleted at the end.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import replace

import pytest

from conftest import PY_ROOT, start_sidecar, subprocess_env
from helpers import random_submission
from oncegate import Gate, Submission

pytestmark = [pytest.mark.sidecar, pytest.mark.rabbitmq]

EXAMPLE = PY_ROOT / "examples" / "rabbitmq_consumer.py"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"

N_UNIQUE = 1700          # unique valid submissions
N_PRECOMMITTED = 100     # of those, committed by the test before publishing
N_PRODUCER_DUPLICATES = 250
N_CONSUMERS = 3
PREFETCH = (8, 16, 32)
MAX_RATE = 8             # deliveries per second per consumer: the queue outlasts the chaos
MIN_KILLS = MIN_DROPS = 3  # chaos goes on until both are reached (rabbitmqctl calls are slow)
CHAOS_SECONDS = 240      # a bound for a failure only
TS = "2026-11-29T10:57:45Z"


def load_example():
    spec = importlib.util.spec_from_file_location("rabbitmq_consumer_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def masked(url: str) -> str:
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


@pytest.fixture(scope="module")
def amqp_url(aio_loop) -> str:
    import aio_pika

    url = os.environ.get("AMQP_URL", DEFAULT_AMQP_URL)

    async def probe():
        connection = await aio_pika.connect(url, timeout=5)
        await connection.close()

    try:
        aio_loop.run(asyncio.wait_for(probe(), 10))
    except Exception as exc:  # any failure to talk AMQP means: no broker here
        pytest.skip(f"no RabbitMQ broker answers at {masked(url)} (set AMQP_URL): {type(exc).__name__}: {exc}")
    return url


class Rabbitmqctl:
    """Broker-side view and control, when rabbitmqctl works here (root, local node)."""

    def __init__(self) -> None:
        self.available = shutil.which("rabbitmqctl") is not None and self._run("status") is not None

    def _run(self, *args: str) -> str | None:
        try:
            result = subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, timeout=30,
                                    stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout.decode(errors="replace") if result.returncode == 0 else None

    def connections(self) -> dict[str, str]:
        """connection_name -> connection pid."""
        out = self._run("list_connections", "--no-table-headers", "pid", "client_properties") or ""
        found = {}
        for line in out.splitlines():
            m = re.search(r'\{"connection_name","([^"]*)"\}', line)
            if m:
                found[m.group(1)] = line.split("\t", 1)[0]
        return found

    def close_connection(self, pid: str, reason: str) -> bool:
        return self._run("close_connection", pid, reason) is not None


class ConsumerProcess:
    """One incarnation of the example consumer; JSON lines collected live."""

    def __init__(self, name: str, args: list[str]):
        self.name = name
        self.lines: list[dict] = []
        self.process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--consumer", name, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(),
        )
        self.stderr_lines: list[str] = []
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stdout(self):
        for raw in self.process.stdout:
            self.lines.append(json.loads(raw))

    def _read_stderr(self):
        for raw in self.process.stderr:
            self.stderr_lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def sessions(self) -> int:
        """How many times it connected and started consuming."""
        return sum("consuming queue=" in line for line in self.stderr_lines)

    def consuming(self, sessions: int, handled_before: int) -> bool:
        """Alive, in its `sessions`-th session, and it handled a delivery
        after line `handled_before`: the broker has filled its window."""
        return self.alive() and self.sessions == sessions and len(self.lines) > handled_before

    def wait_consuming(self, timeout: float, sessions: int = 1) -> None:
        end = time.monotonic() + timeout
        while self.sessions < sessions and self.alive() and time.monotonic() < end:
            time.sleep(0.05)
        assert self.sessions >= sessions, (
            f"{self.name} started consuming {self.sessions} times, expected {sessions}:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> int | None:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self._threads:
            t.join(5)
        return code

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        for t in self._threads:
            t.join(5)

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.stderr_lines[-n:])


def body_of(s: Submission) -> bytes:
    doc = {"award_id": s.award_id, "submission_timestamp": s.submission_timestamp,
           "amount_cents": s.amount_cents, "payload": base64.b64encode(s.payload_bytes).decode()}
    if s.idempotency_key is not None:
        doc["idempotency_key"] = s.idempotency_key
    return json.dumps(doc, ensure_ascii=False).encode()


def test_rabbitmq_consumers_killed_and_cut_off_still_give_an_exact_ledger(
    oncegate_bin, tmp_path, amqp_url, aio_loop, unique, seed
):
    import aio_pika

    started = time.monotonic()
    example = load_example()
    ctl = Rabbitmqctl()
    print(f"rabbitmqctl {'available' if ctl.available else 'NOT available'}")
    rng = random.Random(seed)
    queue_name = f"oncegate-test.{unique}"
    settings = example.Settings(amqp_url=amqp_url, queue=queue_name, consumer="pytest")

    # -- the messages -----------------------------------------------------------
    awards = [f"AWD-{unique}-{i}" for i in range(8)] + [f"Förderung-{unique}-🚀"]
    subs = []
    for i in range(N_UNIQUE):
        s = random_submission(rng, award_id=rng.choice(awards))
        s = replace(s, payload=s.payload_bytes[:2048])  # keep the run small
        if i % 12 == 0:
            s = replace(s, idempotency_key=str(uuid.uuid4()))
        subs.append(s)
    keys = [s.key() for s in subs]
    assert len(set(keys)) == N_UNIQUE
    precommitted = subs[:N_PRECOMMITTED]

    published: list[tuple[str, bytes, str]] = []  # (kind, body, key or expected code)
    for s in subs:
        published.append(("valid", body_of(s), s.key()))
    for s in rng.choices(subs, k=N_PRODUCER_DUPLICATES):
        published.append(("valid", body_of(s), s.key()))
    poison: list[tuple[bytes, str]] = []
    for ts in ("yesterday", "2026-13-29T10:57:45Z", "2026-02-30T10:00:00Z", "2026-11-29T25:00:00Z",
               "2026-11-29T10:57:45"):
        for n in range(4):
            poison.append((body_of(Submission(awards[n], ts, f"bad-ts-{n}".encode(), 100)), "INVALID_ARGUMENT"))
    for amount in (0, -5, -1_000_000):
        poison.append((body_of(Submission(awards[0], TS, f"amount {amount}".encode(), amount)), "INVALID_ARGUMENT"))
    poison.append((body_of(Submission(f"AWD-{unique}|pipe", TS, b"x", 5)), "INVALID_ARGUMENT"))
    # Key reuse against already committed submissions, so the outcome does
    # not depend on which copy a consumer happens to handle first.
    for s in precommitted[:16]:
        if s.idempotency_key is None:   # same derived key, another amount
            poison.append((body_of(replace(s, amount_cents=s.amount_cents + 1)), "FAILED_PRECONDITION"))
        else:                           # the producer's key, another payload
            poison.append((body_of(replace(s, payload=b"other")), "FAILED_PRECONDITION"))
    for body in (b"not json", b"[1, 2, 3]", json.dumps({"submission_timestamp": TS, "amount_cents": 5}).encode(),
                 json.dumps({"award_id": awards[0], "submission_timestamp": TS, "amount_cents": 5,
                             "payload": "***"}).encode(),
                 json.dumps({"award_id": awards[0], "submission_timestamp": TS, "amount_cents": 12.5}).encode()):
        poison.append((body, "MALFORMED"))
    published += [("poison", body, code) for body, code in poison]
    rng.shuffle(published)
    message_ids = [f"m{i}" for i in range(len(published))]
    kind_of = {mid: kind for mid, (kind, _, _) in zip(message_ids, published)}
    expected_code = {mid: extra for mid, (kind, _, extra) in zip(message_ids, published) if kind == "poison"}

    sidecar = start_sidecar(oncegate_bin, tmp_path / "sidecar")
    procs: list[ConsumerProcess] = []
    connection = None
    try:
        # Commit some before publishing: a consumer that died after Submit
        # and before its ack; their deliveries must resolve as DUPLICATE.
        with Gate(sidecar.target, timeout=30) as gate:
            for s in precommitted:
                assert gate.submit(s.award_id, s.submission_timestamp, s.payload, s.amount_cents,
                                   s.idempotency_key).claimed

        async def setup_and_publish():
            conn = await aio_pika.connect(amqp_url, timeout=10)
            channel = await conn.channel()  # publisher confirms on
            await example.declare_topology(channel, settings)
            for first in range(0, len(published), 200):
                await asyncio.gather(*(
                    channel.default_exchange.publish(
                        aio_pika.Message(body, message_id=mid, content_type="application/json",
                                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=queue_name)
                    for mid, (_, body, _) in zip(message_ids[first:first + 200], published[first:first + 200])))
            return conn, channel

        connection, channel = aio_loop.run(setup_and_publish())

        def ready(name: str = queue_name) -> tuple[int, int]:
            async def passive():
                q = await channel.declare_queue(name, passive=True)
                return q.declaration_result.message_count, q.declaration_result.consumer_count
            return aio_loop.run(passive())

        assert ready()[0] == len(published)
        t_published = time.monotonic()

        # -- consumers under fire ---------------------------------------------------
        common = ["--amqp-url", amqp_url, "--target", sidecar.target, "--queue", queue_name,
                  "--timeout", "10"]
        generation = [0] * N_CONSUMERS

        def start(slot: int, *extra: str) -> ConsumerProcess:
            generation[slot] += 1
            p = ConsumerProcess(f"rmq-{unique}-c{slot}-g{generation[slot]}",
                                [*common, "--prefetch", str(PREFETCH[slot]), *extra])
            procs.append(p)
            return p

        slots = [start(i, "--max-rate", str(MAX_RATE)) for i in range(N_CONSUMERS)]
        kills: list[str] = []
        drops: list[str] = []
        dropped: Counter = Counter()               # connection drops per consumer process
        since: dict[str, int] = {}                 # lines a process had printed at its last drop
        deadline = time.monotonic() + CHAOS_SECONDS

        def chaos_done() -> bool:
            return len(kills) >= MIN_KILLS and (not ctl.available or len(drops) >= MIN_DROPS)

        def holds_unacked(p: ConsumerProcess) -> bool:
            # Consuming in its current session, more than any prefetch ready.
            return p.consuming(1 + dropped[p.name], since.get(p.name, 0)) and ready()[0] > max(PREFETCH)

        while not chaos_done():
            assert time.monotonic() < deadline, (
                f"chaos not done in {CHAOS_SECONDS}s: {len(kills)} kills, {len(drops)} drops, {ready()[0]} ready")
            assert ready()[0] > max(PREFETCH), (
                f"the queue ran low before the chaos was done: {len(kills)} kills, {len(drops)} drops")
            time.sleep(rng.uniform(0.2, 0.6))
            candidates = [i for i, p in enumerate(slots) if holds_unacked(p)]
            if not candidates:
                continue
            slot = rng.choice(candidates)
            victim = slots[slot]
            # Take turns; once one kind has its count, only the other.
            want_kill = len(kills) < MIN_KILLS and (len(kills) <= len(drops) or len(drops) >= MIN_DROPS)
            if want_kill or not ctl.available:
                victim.kill()
                kills.append(victim.name)
                slots[slot] = start(slot, "--max-rate", str(MAX_RATE))
                continue
            pid = ctl.connections().get(victim.name)
            if pid is None or not holds_unacked(victim):
                continue  # not listed yet, or its state changed meanwhile: another turn
            assert ctl.close_connection(pid, "oncegate test: broker-side connection drop")
            drops.append(victim.name)
            dropped[victim.name] += 1
            since[victim.name] = len(victim.lines)
        t_chaos = time.monotonic()
        print(f"chaos: {len(kills)} SIGKILLs, {len(drops)} connection drops in {t_chaos - t_published:.1f}s; "
              f"{ready()[0]} ready left")

        # -- drain: the survivors stop cleanly, one consumer finishes the queue ------
        for p in slots:
            # Cut off consumers reconnect by themselves; and a SIGTERM during
            # its imports would just end a process.
            p.wait_consuming(30, sessions=1 + dropped[p.name])
            p.process.send_signal(signal.SIGTERM)
        for p in slots:
            code = p.wait(30)
            assert code == 0, f"{p.name} did not stop cleanly on SIGTERM ({code}):\n{p.log_tail()}"
        drainer = ConsumerProcess(f"rmq-{unique}-drainer", [*common, "--prefetch", "64", "--exit-when-drained"])
        procs.append(drainer)
        assert drainer.wait(120) == 0, f"drainer did not finish:\n{drainer.log_tail()}"
        t_drained = time.monotonic()

        # -- the broker: work queue empty, exactly the poison dead-lettered ---------
        # Nothing ready and no consumer (so nothing unacked either: a closed
        # channel's deliveries go back to ready), and a basic.get finds nothing.
        # (rabbitmqctl's queue counts are statistics that lag by seconds.)
        assert ready() == (0, 0), "work queue not empty after the drain"

        async def get_one(name):
            q = await channel.get_queue(name, ensure=False)
            return await q.get(fail=False, no_ack=False, timeout=5)

        assert aio_loop.run(get_one(queue_name)) is None, "work queue not empty after the drain"
        dead_deadline = time.monotonic() + 15
        while ready(settings.dead_letter_queue)[0] < len(poison) and time.monotonic() < dead_deadline:
            time.sleep(0.2)  # at-least-once dead-lettering is asynchronous
        time.sleep(0.5)

        async def take_dead():
            q = await channel.get_queue(settings.dead_letter_queue, ensure=False)
            dead = []
            while (m := await q.get(fail=False, no_ack=True, timeout=5)) is not None:
                dead.append(m)
            return dead

        dead = aio_loop.run(take_dead())
        missing = sorted(set(expected_code) - {m.message_id for m in dead})
        reported = {line["message_id"]: line for p in procs for line in p.lines if line["outcome"] == "DEAD_LETTER"}
        assert len(dead) == len(poison), (
            f"dead-letter queue holds {len(dead)}, expected {len(poison)}; missing: "
            f"{[(mid, expected_code[mid], reported.get(mid)) for mid in missing]}")
        assert Counter(m.body for m in dead) == Counter(body for body, _ in poison)
        assert sorted(m.message_id for m in dead) == sorted(expected_code)
        for m in dead:
            death = m.headers["x-death"][0]
            assert (death["reason"], death["queue"]) == ("rejected", queue_name), death

        # -- the ledger ------------------------------------------------------------
        expected_total: dict[str, int] = defaultdict(int)
        expected_count: Counter = Counter()
        for s in subs:
            expected_total[s.award_id] += s.amount_cents
            expected_count[s.award_id] += 1
        with Gate(sidecar.target, timeout=30) as gate:
            stored = {}
            for s, key in zip(subs, keys, strict=True):
                found = gate.lookup(key)
                assert found is not None, f"no decision stored for key {key[:12]}"
                d = found.disbursement
                assert (d.award_id, d.amount_cents) == (s.award_id, s.amount_cents), key[:12]
                stored[key] = d
        assert len({d.id for d in stored.values()}) == N_UNIQUE
        sequences = defaultdict(list)
        for d in stored.values():
            sequences[d.award_id].append(d.sequence)
        for award, seqs in sequences.items():
            assert sorted(seqs) == list(range(1, len(seqs) + 1)), award

        db = sqlite3.connect(f"file:{sidecar.sqlite_path}?mode=ro", uri=True)
        try:
            assert db.execute("select count(*) from disbursements").fetchone()[0] == N_UNIQUE
            ledger = {a: (n, total) for a, n, total in db.execute(
                "select award_id, count(*), sum(amount_cents) from disbursements group by award_id")}
            balances = {a: (seq, total) for a, seq, total in db.execute(
                "select award_id, last_sequence, total_cents from award_balances")}
        finally:
            db.close()
        assert ledger == {a: (expected_count[a], expected_total[a]) for a in expected_total}
        assert balances == {a: (expected_count[a], expected_total[a]) for a in expected_total}

        # -- what the consumers reported -----------------------------------------------
        lines = [line for p in procs for line in p.lines]
        claimed = Counter(line["key"] for line in lines if line["outcome"] == "CLAIMED")
        assert not [k for k, n in claimed.items() if n > 1], "a key was CLAIMED twice"
        assert set(claimed) <= set(keys)
        assert not set(claimed) & {s.key() for s in precommitted}, "a pre-committed key was CLAIMED again"
        for line in lines:
            if line["outcome"] == "DEAD_LETTER":
                assert kind_of[line["message_id"]] == "poison", line
                assert line["code"] == expected_code[line["message_id"]], line
            elif line["outcome"] in ("CLAIMED", "DUPLICATE"):
                assert kind_of[line["message_id"]] == "valid", line
        assert not [line for line in lines if line["outcome"] == "ERROR"], "sidecar errors in a healthy run"
        outcomes = Counter(line["outcome"] for line in lines)
        redelivered = sum(1 for line in lines if line["redelivered"])
        acks_lost = sum(1 for line in lines if line.get("acked") is False or line.get("rejected") is False)
        reconnects = sum(max(p.sessions - 1, 0) for p in procs)

        # Consumers killed or cut off while holding unacked deliveries: those
        # come back to another consumer marked redelivered, and a cut-off one
        # connects again by itself (waited for above).
        assert redelivered > 0, "killing consumers with unacked deliveries must cause redeliveries"
        if ctl.available:
            assert reconnects >= len(drops), f"{reconnects} reconnects after {len(drops)} drops"
        print(f"published {len(published)} messages ({N_UNIQUE} unique valid, "
              f"{N_PRODUCER_DUPLICATES} producer duplicates, {N_PRECOMMITTED} already committed, "
              f"{len(poison)} poison); {N_CONSUMERS} consumers, prefetch {PREFETCH}, "
              f"{len(procs)} processes in all; {len(kills)} SIGKILLs, {len(drops)} connection drops, "
              f"{reconnects} reconnects; reported outcomes {dict(outcomes)}, {redelivered} redelivered, "
              f"{acks_lost} acks/rejects lost with their channel; dead-letter queue {len(dead)}; "
              f"publish {t_published - started:.1f}s, chaos {t_chaos - t_published:.1f}s, "
              f"drain {t_drained - t_chaos:.1f}s, total {time.monotonic() - started:.1f}s")
    finally:
        for p in procs:
            p.kill()

        async def cleanup():
            conn = await aio_pika.connect(amqp_url, timeout=10)
            ch = await conn.channel()
            for name in (queue_name, settings.dead_letter_queue):
                await ch.queue_delete(name)
            await ch.exchange_delete(settings.dead_letter_exchange)
            await conn.close()
            if connection is not None:
                await connection.close()

        try:
            aio_loop.run(cleanup())
        finally:
            sidecar.stop()
