// The Kafka example in a group of two against the suite's Kafka and a real
// sidecar: twice, a member holding decided, uncommitted messages is
// SIGKILLed (each in turn when both hold some) and restarted under its name;
// then an exact ledger and exactly the poison in the dead-letter topic.
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes, randomInt } from "node:crypto";
import { openSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import kafkajs, { type KafkaMessage } from "kafkajs";
import { deriveIdempotencyKey, Gate, type Submission } from "../src/index.js";
import { startSidecar, tempDir, type Sidecar } from "./sidecar.js";

const { Kafka, logLevel } = kafkajs;
const BOOTSTRAP = process.env.ONCEGATE_TEST_KAFKA_BOOTSTRAP || process.env.KAFKA_BOOTSTRAP || "127.0.0.1:9092";
const EXAMPLE = resolve(import.meta.dirname, "../examples/kafka-consumer.js");
const TS = "2026-11-29T10:57:45Z";
const kafka = new Kafka({ clientId: "tstest", brokers: BOOTSTRAP.split(","), logLevel: logLevel.NOTHING });

interface Msg { id: string; kind: "valid" | "poison"; code?: string; key: string; value: string; sub?: Submission }

const keyOf = (s: Submission) => s.idempotencyKey ?? deriveIdempotencyKey(s.awardId, s.submissionTimestamp, s.payload);
const bodyOf = (s: Submission) => JSON.stringify({ award_id: s.awardId, submission_timestamp: s.submissionTimestamp,
  amount_cents: Number(s.amountCents), payload: Buffer.from(s.payload as Uint8Array).toString("base64"),
  ...(s.idempotencyKey ? { idempotency_key: s.idempotencyKey } : {}) });

function randomSubmission(award: string): Submission {
  const two = (n: number) => String(n).padStart(2, "0");
  return { awardId: award, payload: randomBytes(randomInt(1024)), amountCents: 1 + randomInt(10_000_000),
    submissionTimestamp: `2026-${two(1 + randomInt(12))}-${two(1 + randomInt(28))}T${two(randomInt(24))}:${two(randomInt(60))}:${two(randomInt(60))}.${String(randomInt(1e6)).padStart(6, "0")}Z` };
}

/** 600 unique submissions on 6 awards (every tenth with a producer key),
 * 100 producer duplicates, 6 poison, shuffled; 20 for an aborted transaction. */
function corpus(unique: string) {
  const award = (i: number) => `AWD-${unique}-${i}`;
  const subs = Array.from({ length: 600 }, (_, i) => {
    const s = randomSubmission(award(randomInt(6)));
    return i % 10 === 0 ? { ...s, idempotencyKey: `intent-${unique}-${i}` } : s;
  });
  const valid = [...subs, ...Array.from({ length: 100 }, () => subs[randomInt(subs.length)]!)];
  const msgs: Msg[] = valid.map((s) => ({ id: "", kind: "valid", key: s.awardId, value: bodyOf(s), sub: s }));
  const poison: [string, string][] = [
    [bodyOf({ awardId: award(0), submissionTimestamp: "yesterday", payload: Buffer.from("x"), amountCents: 100 }), "INVALID_ARGUMENT"],
    [bodyOf({ awardId: award(1), submissionTimestamp: TS, payload: Buffer.from("zero"), amountCents: 0 }), "INVALID_ARGUMENT"],
    [bodyOf({ awardId: award(2), submissionTimestamp: "2026-02-30T10:00:00Z", payload: Buffer.from("y"), amountCents: 5 }), "INVALID_ARGUMENT"],
    ["not json", "MALFORMED"], ["[1, 2]", "MALFORMED"],
    [JSON.stringify({ award_id: award(0), submission_timestamp: TS, amount_cents: 1.5 }), "MALFORMED"],
  ];
  msgs.push(...poison.map(([value, code]): Msg => ({ id: "", kind: "poison", code, key: "poison", value })));
  for (let i = msgs.length - 1; i > 0; i--) {
    const j = randomInt(i + 1);
    [msgs[i], msgs[j]] = [msgs[j]!, msgs[i]!];
  }
  msgs.forEach((m, i) => (m.id = `m${i}`));
  const aborted = Array.from({ length: 20 }, () => randomSubmission(award(3)));
  return { msgs, subs, aborted };
}

async function produce(topic: string, msgs: { id: string; key: string; value: string }[], commit: boolean) {
  const producer = kafka.producer({ transactionalId: `tstest-${randomBytes(6).toString("hex")}`, idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const tx = await producer.transaction();
  await tx.send({ topic, messages: msgs.map((m) => ({ key: m.key, value: m.value, headers: { message_id: m.id } })) });
  await (commit ? tx.commit() : tx.abort());
  await producer.disconnect();
}

/** A topic read read_committed: at least `expect` messages, then a quiet 1.5 s. */
async function readAll(topic: string, expect: number): Promise<KafkaMessage[]> {
  const consumer = kafka.consumer({ groupId: `tstest-reader-${randomBytes(6).toString("hex")}`, readUncommitted: false });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const found: KafkaMessage[] = [];
  let last = Date.now();
  await consumer.run({ eachMessage: async ({ message }) => { found.push(message); last = Date.now(); } });
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline && !(found.length >= expect && Date.now() - last > 1500)) await sleep(100);
  await consumer.disconnect();
  return found;
}

const sleep = (ms: number) => new Promise((ok) => setTimeout(ok, ms));

class Proc {
  lines: Record<string, any>[] = [];
  child: ChildProcess;
  exited: Promise<number | null>;
  log: string;
  constructor(readonly name: string, args: string[]) {
    this.log = join(tempDir("oncegate-kc-"), `${name}.log`);
    this.child = spawn(process.execPath, [EXAMPLE, "--consumer", name, ...args], { stdio: ["ignore", "pipe", openSync(this.log, "a")] });
    createInterface({ input: this.child.stdout! }).on("line", (l) => this.lines.push(JSON.parse(l)));
    this.exited = new Promise((ok) => this.child.once("exit", (code) => ok(code)));
  }
  async kill() {
    this.child.kill("SIGKILL");
    await this.exited;
  }
  async terminate(): Promise<number | null> {
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 60_000);
    const code = await this.exited;
    clearTimeout(timer);
    return code;
  }
  logTail(): string {
    return readFileSync(this.log, "utf8").trimEnd().split("\n").slice(-30).join("\n");
  }
}

const decisions = (lines: Record<string, any>[]) => lines.filter((l) => l.outcome && l.outcome !== "ERROR").length;
/** The last line is a decision: decided messages not yet committed. */
const holdsUncommitted = (lines: Record<string, any>[]) => lines.length > 0 && lines[lines.length - 1]!.outcome !== undefined;

async function waitFor(what: string, cond: () => boolean, timeoutMs: number, procs: Proc[]) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (cond()) return;
    await sleep(20);
  }
  assert.fail(`timed out waiting for ${what}\n${procs.map((p) => `--- ${p.name}\n${p.logTail()}`).join("\n")}`);
}

function sqlite(sc: Sidecar, query: string): string {
  const r = spawnSync("sqlite3", ["-readonly", join(sc.dir, "oncegate.db"), query], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.trim();
}

test("consumers SIGKILLed in a group of two give an exact ledger and exactly the poison dead-lettered", async () => {
  const started = Date.now();
  const unique = randomBytes(5).toString("hex");
  const [topic, dlt, group] = [`oncegate-tstest.${unique}`, `oncegate-tstest.${unique}.dead`, `tstest-${unique}`];
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 3 }, { topic: dlt, numPartitions: 1 }], waitForLeaders: true });
  const { msgs, subs, aborted } = corpus(unique);
  await produce(topic, msgs, true);
  await produce(topic, aborted.map((s, i) => ({ id: `aborted${i}`, key: "a", value: bodyOf(s) })), false);
  const sc = await startSidecar();
  const procs: Proc[] = [];
  try {
    const args = ["--bootstrap-servers", BOOTSTRAP, "--topic", topic, "--group", group, "--dead-letter-topic", dlt,
      "--target", sc.target, "--session-timeout-ms", "6000", "--max-rate", "40", "--commit-every", "20"];
    const start = (name: string) => {
      const p = new Proc(name, args);
      procs.push(p);
      return p;
    };
    const slots = [start(`tc-${unique}-a`), start(`tc-${unique}-b`)];
    const decided = () => procs.reduce((n, p) => n + decisions(p.lines), 0);
    const kills: string[] = [];
    for (const round of [0, 1]) {
      // The victim: a member holding uncommitted decisions, this round's slot
      // when it does (a member whose partitions are all decided holds none).
      const target = decided() + 120;
      let victim = -1;
      await waitFor(`${target} decisions, then a member holding uncommitted decisions`, () => {
        if (decided() < target) return false;
        victim = [round, 1 - round].find((i) => holdsUncommitted(slots[i]!.lines)) ?? -1;
        return victim >= 0;
      }, 120_000, procs);
      const p = slots[victim]!;
      await p.kill();
      kills.push(`${p.name} after ${decisions(p.lines)} decisions`);
      slots[victim] = start(p.name); // same name: fences its dead-letter transaction
    }
    const chaos = Date.now();
    const ledgerCount = () => Number(sqlite(sc, "select count(*) from disbursements"));
    await waitFor("every unique submission in the ledger", () => ledgerCount() >= subs.length, 180_000, procs);
    for (const p of slots) assert.equal(await p.terminate(), 0, `${p.name} did not stop cleanly on SIGTERM\n${p.logTail()}`);
    const dead = await readAll(dlt, 6); // after the stop: nothing more can arrive

    await checkLedger(sc, subs, aborted, ledgerCount());
    const poison = new Map(msgs.filter((m) => m.kind === "poison").map((m) => [m.id, m.code]));
    const got = dead.map((m) => [m.headers!.message_id!.toString(), m.headers!.oncegate_error!.toString()] as const);
    assert.equal(got.length, poison.size, `each poison message once: ${JSON.stringify(got)}`);
    assert.deepEqual(new Map(got), poison, "the dead-letter topic holds exactly the poison, with its codes");
    const outcomes = checkLines(procs, msgs, subs);
    console.log(`kafka ts: ${msgs.length} messages (${subs.length} unique, 100 producer duplicates, 6 poison) + 20 aborted; `
      + `SIGKILLs: ${kills.join(", ")}; ledger ${ledgerCount()} rows exact; dead-letter topic ${dead.length}; `
      + `outcomes ${JSON.stringify(outcomes)}; produce+start ${((chaos - started) / 1000).toFixed(1)}s, chaos+finish ${((Date.now() - chaos) / 1000).toFixed(1)}s`);
  } finally {
    await Promise.all(procs.map((p) => p.kill()));
    await sc.stop();
    await admin.deleteTopics({ topics: [topic, dlt] }).catch(() => undefined);
    await admin.disconnect();
  }
});

async function checkLedger(sc: Sidecar, subs: Submission[], aborted: Submission[], rows: number) {
  const gate = new Gate(sc.target, { timeoutMs: 30_000 });
  const want = new Map<string, [number, bigint]>();
  try {
    for (const s of subs) {
      const d = await gate.lookup(keyOf(s));
      assert.ok(d && d.disbursement.awardId === s.awardId && d.disbursement.amountCents === BigInt(s.amountCents),
        `no exact decision stored for key ${keyOf(s).slice(0, 12)}`);
      const [n, sum] = want.get(s.awardId) ?? [0, 0n];
      want.set(s.awardId, [n + 1, sum + BigInt(s.amountCents)]);
    }
    for (const s of aborted) assert.equal(await gate.lookup(keyOf(s)), null, "a message of an aborted transaction took effect");
  } finally {
    gate.close();
  }
  assert.equal(rows, subs.length, "one ledger row per unique submission");
  const ledger = sqlite(sc, "select award_id, count(*), sum(amount_cents), min(sequence), max(sequence), count(distinct sequence) from disbursements group by award_id");
  for (const row of ledger.split("\n")) {
    const [award, n, sum, min, max, distinct] = row.split("|");
    assert.deepEqual([Number(n), BigInt(sum!)], want.get(award!), `award ${award} totals`);
    assert.deepEqual([min, max, distinct], ["1", n, n], `award ${award}: sequences 1..n`);
  }
}

/** No key CLAIMED twice, every submission decided, only the poison
 * dead-lettered, nothing aborted, no error in a healthy run. */
function checkLines(procs: Proc[], msgs: Msg[], subs: Submission[]): Record<string, number> {
  const byId = new Map(msgs.map((m) => [m.id, m]));
  const claimed = new Map<string, number>();
  const decidedKeys = new Set<string>();
  const outcomes: Record<string, number> = {};
  for (const l of procs.flatMap((p) => p.lines).filter((l) => l.outcome)) {
    outcomes[l.outcome] = (outcomes[l.outcome] ?? 0) + 1;
    const m = byId.get(l.message_id);
    assert.ok(m, `a line for a message not produced (aborted?): ${JSON.stringify(l)}`);
    assert.notEqual(l.outcome, "ERROR", `a sidecar error in a healthy run: ${JSON.stringify(l)}`);
    if (l.outcome === "DEAD_LETTER") assert.ok(m.kind === "poison" && l.code === m.code, JSON.stringify(l));
    else {
      assert.ok(m.kind === "valid" && l.key === keyOf(m.sub!), `decided wrongly: ${JSON.stringify(l)}`);
      decidedKeys.add(l.key);
      if (l.outcome === "CLAIMED") claimed.set(l.key, (claimed.get(l.key) ?? 0) + 1);
    }
  }
  assert.deepEqual([...claimed].filter(([, n]) => n > 1), [], "a key CLAIMED twice");
  assert.deepEqual(subs.filter((s) => !decidedKeys.has(keyOf(s))).length, 0, "every submission decided");
  return outcomes;
}

test("the consumer waits out a sidecar outage: retryable errors, nothing dead-lettered, every message decided once", async () => {
  const unique = randomBytes(5).toString("hex");
  const [topic, dlt, group] = [`oncegate-tstest.${unique}`, `oncegate-tstest.${unique}.dead`, `tstest-${unique}`];
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 2 }, { topic: dlt, numPartitions: 1 }], waitForLeaders: true });
  const batch = (prefix: string) => Array.from({ length: 40 }, (_, i) => {
    const s = { ...randomSubmission(`AWD-${unique}-${i % 3}`), payload: Buffer.from(`${prefix}-${i}-${randomBytes(8).toString("hex")}`) };
    return { id: `${prefix}${i}`, key: s.awardId, value: bodyOf(s), sub: s };
  });
  const [first, second] = [batch("f"), batch("s")];
  let sc = await startSidecar();
  const dir = sc.dir;
  const consumer = new Proc(`tc-${unique}`, ["--bootstrap-servers", BOOTSTRAP, "--topic", topic, "--group", group,
    "--dead-letter-topic", dlt, "--target", sc.target, "--timeout-ms", "2000"]);
  try {
    const ledgerCount = () => Number(sqlite(sc, "select count(*) from disbursements"));
    await produce(topic, first, true);
    await waitFor("the first 40 in the ledger", () => ledgerCount() >= 40, 60_000, [consumer]);
    assert.equal(await sc.stop(), 0);
    await produce(topic, second, true);
    const errors = () => consumer.lines.filter((l) => l.outcome === "ERROR");
    await waitFor("the consumer to meet the outage three times", () => errors().length >= 3, 60_000, [consumer]);
    assert.equal(ledgerCount(), 40, "the ledger changed while the sidecar was down");
    sc = await startSidecarOn(sc, dir);
    await waitFor("the second 40 after the outage", () => ledgerCount() >= 80, 90_000, [consumer]);
    assert.equal(await consumer.terminate(), 0, consumer.logTail());
    await checkLedger(sc, [...first, ...second].map((m) => m.sub), [], ledgerCount());
    assert.ok(errors().every((l) => l.retryable === true), "only retryable errors during an outage");
    assert.ok(!consumer.lines.some((l) => l.outcome === "DEAD_LETTER"), "an outage must not dead-letter");
    const claimed = consumer.lines.filter((l) => l.outcome === "CLAIMED").map((l) => l.key).sort();
    assert.deepEqual(claimed, [...first, ...second].map((m) => keyOf(m.sub)).sort(), "every message CLAIMED once");
    console.log(`kafka ts outage: ${errors().length} retryable errors while the sidecar was down, 80 decided once, nothing dead-lettered`);
  } finally {
    await consumer.kill();
    await sc.stop();
    await admin.deleteTopics({ topics: [topic, dlt] }).catch(() => undefined);
    await admin.disconnect();
  }
});

/** The same sidecar started again in place: its directory and port. */
function startSidecarOn(old: Sidecar, dir: string): Promise<Sidecar> {
  return startSidecar({}, dir, Number(old.target.split(":")[1]));
}
