// A Kafka consumer with exactly-once effect through the oncegate sidecar
// (kafkajs). The loop (DESIGN §1):
//
//     fetch -> gate.submit -> commit the offset only after CLAIMED or DUPLICATE
//
// * read_committed (only committed transactions are read, so the oncegate
//   relay's Kafka transactions come through exactly once), no auto-commit:
//   an offset is committed only once its message is decided, after every
//   decision or every --commit-every decisions. Killed before the commit, the
//   message is read again (here or by the partition's next owner) and the
//   sidecar answers DUPLICATE.
// * A message error (malformed body, InvalidSubmission, KeyReused): retrying
//   can never succeed. The message goes to the dead-letter topic (its key,
//   value and headers plus oncegate_error, oncegate_error_message,
//   oncegate_source) and its offset is committed in the same Kafka
//   transaction, so a read_committed reader of the dead-letter topic sees
//   each poison message once.
// * A retryable error (sidecar or its store down, overloaded, deadline): no
//   commit; the partition is sought back to the message and paused for a
//   backoff, then resumed; the other partitions go on meanwhile.
// * SIGTERM/SIGINT: finish the message in hand, commit what was decided,
//   leave the group, exit 0.
//
// Messages: the JSON body of the Python examples (award_id,
// submission_timestamp, amount_cents, payload base64, optional
// idempotency_key). One JSON line per handled message on stdout, before its
// offset is committed (and one per commit); logs on stderr; payloads are
// never logged.
//
//   node kafka-consumer.js --bootstrap-servers kafka:9092 --topic grants --group grants-workers \
//       --dead-letter-topic grants.dead --consumer "$POD_NAME" --target 127.0.0.1:50051
import { hostname } from "node:os";
import { parseArgs } from "node:util";
import kafkajs, { type Consumer, type KafkaMessage, type Producer } from "kafkajs";
import { actionFor, Gate, GateError, type Submission } from "../src/index.js";

const { Kafka, logLevel } = kafkajs;

const { values: opt } = parseArgs({
  options: {
    "bootstrap-servers": { type: "string", default: process.env.KAFKA_BOOTSTRAP ?? "127.0.0.1:9092" },
    topic: { type: "string" },
    group: { type: "string" },
    "dead-letter-topic": { type: "string" },
    target: { type: "string", default: process.env.ONCEGATE_TARGET ?? "127.0.0.1:50051" },
    consumer: { type: "string", default: `${hostname()}-${process.pid}` },
    "timeout-ms": { type: "string", default: "10000" },
    "session-timeout-ms": { type: "string", default: "10000" },
    "commit-every": { type: "string", default: "1" },
    "max-rate": { type: "string", default: "0" },
  },
});
if (!opt.topic || !opt.group || Number(opt["commit-every"]) < 1) {
  console.error("kafka-consumer: --topic and --group are required, --commit-every at least 1");
  process.exit(64);
}
const topic = opt.topic;
const group = opt.group;
const deadLetterTopic = opt["dead-letter-topic"] ?? `${topic}.dead`;
const name = opt.consumer!;
const commitEvery = Number(opt["commit-every"]);
const maxRate = Number(opt["max-rate"]);

const log = (level: string, message: string, fields: Record<string, unknown> = {}) =>
  console.error(JSON.stringify({ time: new Date().toISOString(), level, message, ...fields }));
const line = (fields: Record<string, unknown>) =>
  process.stdout.write(JSON.stringify({ consumer: name, ...fields }) + "\n");
const sleep = (ms: number) => new Promise((ok) => setTimeout(ok, ms));

class MalformedMessage extends Error {}

/** The JSON body; errors name the field, never quote the body. */
function parseBody(body: Buffer | null): Submission {
  let doc: unknown;
  try {
    doc = JSON.parse(body?.toString("utf8") ?? "");
  } catch {
    throw new MalformedMessage("body is not JSON");
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new MalformedMessage("body is not a JSON object");
  const d = doc as Record<string, unknown>;
  const text = (field: string, required: boolean) => {
    const v = d[field];
    if ((v === undefined || v === null) && !required) return undefined;
    if (typeof v !== "string") throw new MalformedMessage(`field ${field}: ${v === undefined ? "missing" : "must be a string"}`);
    return v;
  };
  const amount = d.amount_cents;
  if (!(Number.isSafeInteger(amount) || (typeof amount === "string" && /^-?[0-9]+$/.test(amount)))) {
    throw new MalformedMessage(`field amount_cents: ${amount === undefined ? "missing" : "must be an integer"}`);
  }
  const payload = text("payload", false) ?? "";
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(payload) || payload.length % 4 !== 0) throw new MalformedMessage("field payload: not base64");
  return {
    awardId: text("award_id", true)!, submissionTimestamp: text("submission_timestamp", true)!,
    payload: Buffer.from(payload, "base64"), amountCents: BigInt(amount as number | string),
    idempotencyKey: text("idempotency_key", false),
  };
}

const header = (m: KafkaMessage, key: string) => m.headers?.[key]?.toString();

class KafkaGateConsumer {
  stopping = false;
  inBatch = false;
  private decided = new Map<number, string>(); // partition -> next offset, decided and not committed
  private sinceCommit = 0;
  private failures = new Map<number, number>();

  constructor(private gate: Gate, private consumer: Consumer, private producer: Producer) {}

  /** The batch's messages in order; stops at a retryable error (the
   * partition is sought back and paused) or when stopping. */
  async batch(partition: number, messages: KafkaMessage[], resolveOffset: (offset: string) => void,
    isRunning: () => boolean, isStale: () => boolean, pause: () => () => void, heartbeat: () => Promise<void>): Promise<void> {
    this.inBatch = true;
    try {
      for (const m of messages) {
        if (!isRunning() || isStale() || this.stopping) break;
        if (maxRate > 0) await sleep(1000 / maxRate);
        if (!(await this.handle(partition, m))) {
          const n = (this.failures.get(partition) ?? 0) + 1;
          this.failures.set(partition, n);
          this.consumer.seek({ topic, partition, offset: m.offset });
          const resume = pause();
          setTimeout(resume, Math.min(50 * 2 ** Math.min(n, 7), 5000));
          break;
        }
        this.failures.delete(partition);
        // Where kafkajs fetches next (not a commit): without it the next
        // fetch starts again from the last commit.
        resolveOffset(m.offset);
        try {
          await heartbeat();
        } catch (err) {
          // A rebalance began: commit what was decided while this member
          // still owns its partitions (the coordinator takes commits of the
          // current generation until the rejoin), then let kafkajs rejoin.
          await this.commitDecided();
          throw err;
        }
      }
      if (this.stopping) await this.commitDecided();
    } finally {
      this.inBatch = false;
    }
  }

  /** One message: true when decided (or dead-lettered), false to retry. */
  private async handle(partition: number, m: KafkaMessage): Promise<boolean> {
    let submission: Submission;
    try {
      submission = parseBody(m.value);
    } catch (err) {
      if (!(err instanceof MalformedMessage)) throw err;
      return this.deadLetter(partition, m, "MALFORMED", err.message);
    }
    try {
      const d = await this.gate.submit(submission, { traceparent: header(m, "traceparent") });
      // The line goes out before the commit: a committed message is never read again.
      this.emit(partition, m, { outcome: d.outcome, key: d.idempotencyKey, disbursement_id: d.disbursement.id,
        sequence: Number(d.disbursement.sequence), decided_by: d.decidedBy });
    } catch (err) {
      if (actionFor(err) === "dead-letter") {
        const e = err as GateError;
        return this.deadLetter(partition, m, e.codeName, e.details);
      }
      const code = err instanceof GateError ? err.codeName : "UNKNOWN";
      log("warn", "submit failed, the partition waits", { partition, offset: m.offset, code });
      this.emit(partition, m, { outcome: "ERROR", code, retryable: actionFor(err) === "retry" });
      return false;
    }
    this.decided.set(partition, (BigInt(m.offset) + 1n).toString());
    if (++this.sinceCommit >= commitEvery) await this.commitDecided();
    return true;
  }

  /** After a rejoin: decided offsets not committed before it belong to
   * the old assignment; committing them now could move another member's
   * partition back. They are read again (DUPLICATE) instead. */
  rejoined(partitions: number[]): void {
    if (this.decided.size > 0) log("warn", "dropping decided offsets of the old assignment: read again", { partitions: [...this.decided.keys()] });
    this.decided.clear();
    this.sinceCommit = 0;
    log("info", "assigned", { partitions });
  }

  /** Commits the decided offsets (a failure leaves them to be read again). */
  async commitDecided(): Promise<void> {
    if (this.decided.size === 0) return;
    const partitions = [...this.decided].map(([partition, offset]) => ({ topic, partition, offset }));
    this.decided.clear();
    this.sinceCommit = 0;
    try {
      await this.consumer.commitOffsets(partitions);
      line({ commit: true, offsets: partitions.map((p) => `${p.partition}/${p.offset}`) });
    } catch (err) {
      log("warn", "commit failed: those messages are read again", { err: String(err) });
    }
  }

  /** The message to the dead-letter topic and its offset, in one transaction. */
  private async deadLetter(partition: number, m: KafkaMessage, code: string, reason: string): Promise<boolean> {
    const headers = { ...m.headers, oncegate_error: code, oncegate_error_message: reason,
      oncegate_source: `${topic}/${partition}/${m.offset}` };
    const offset = (BigInt(m.offset) + 1n).toString();
    const tx = await this.producer.transaction();
    try {
      await tx.send({ topic: deadLetterTopic, messages: [{ key: m.key, value: m.value, headers }] });
      await tx.sendOffsets({ consumerGroupId: group, topics: [{ topic, partitions: [{ partition, offset }] }] });
      await tx.commit();
    } catch (err) {
      log("warn", "dead-letter transaction failed: the message is read again", { partition, offset: m.offset, err: String(err) });
      await tx.abort().catch(() => undefined);
      this.emit(partition, m, { outcome: "ERROR", code: "DEAD_LETTER_FAILED", retryable: true });
      return false;
    }
    if (this.decided.get(partition) !== undefined && BigInt(this.decided.get(partition)!) <= BigInt(offset)) {
      this.decided.delete(partition); // committed past them
    }
    log("error", "dead-lettered", { partition, offset: m.offset, code, reason });
    this.emit(partition, m, { outcome: "DEAD_LETTER", code, message: reason });
    return true;
  }

  private emit(partition: number, m: KafkaMessage, fields: Record<string, unknown>): void {
    line({ partition, offset: Number(m.offset), message_id: header(m, "message_id") ?? header(m, "event_id") ?? null, ...fields });
  }
}

async function main(): Promise<number> {
  const kafka = new Kafka({
    clientId: name, brokers: opt["bootstrap-servers"]!.split(","), logLevel: logLevel.WARN,
    logCreator: () => ({ level, log: entry }) => log(logLevel[level] ?? "info", entry.message, { logger: "kafkajs" }),
  });
  const sessionTimeout = Number(opt["session-timeout-ms"]);
  const consumer = kafka.consumer({ groupId: group, readUncommitted: false, sessionTimeout,
    heartbeatInterval: Math.max(Math.floor(sessionTimeout / 4), 100), rebalanceTimeout: Math.max(sessionTimeout, 10_000) });
  // One transactional id per consumer name: a restarted consumer of the same
  // name fences its predecessor and aborts what it left open.
  const producer = kafka.producer({ transactionalId: `${group}.dead-letter.${name}`, idempotent: true,
    maxInFlightRequests: 1, transactionTimeout: 10_000 });
  const gate = new Gate(opt.target, { timeoutMs: Number(opt["timeout-ms"]) });
  const worker = new KafkaGateConsumer(gate, consumer, producer);
  consumer.on(consumer.events.GROUP_JOIN, (e) => worker.rejoined(e.payload.memberAssignment[topic] ?? []));
  await producer.connect();
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const stopped = new Promise<void>((resolve) => {
    const stop = () => {
      log("info", "stopping: finishing the message in hand");
      worker.stopping = true;
      resolve();
    };
    process.once("SIGTERM", stop);
    process.once("SIGINT", stop);
  });
  await consumer.run({
    autoCommit: false, eachBatchAutoResolve: false, partitionsConsumedConcurrently: 1,
    eachBatch: ({ batch, resolveOffset, isRunning, isStale, pause, heartbeat }) =>
      worker.batch(batch.partition, batch.messages, resolveOffset, isRunning, isStale, pause, heartbeat),
  });
  log("info", "consuming", { topic, group });
  await stopped;
  if (!worker.inBatch) await worker.commitDecided(); // (a batch in hand commits at its end)
  await consumer.stop(); // waits for the batch in hand
  await consumer.disconnect(); // leaves the group: its partitions move at once
  await producer.disconnect();
  gate.close();
  return 0;
}

main().then((code) => process.exit(code), (err) => {
  log("error", "consumer failed", { err: String(err) });
  process.exit(1);
});
