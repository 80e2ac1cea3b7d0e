// Validation as the sidecar's (src/submission.rs), with the sidecar's own
// table of refused characters (src/gen/refused.ts, from clients/vectors/),
// so it agrees with the server byte for byte whatever Node's Unicode version.
// The sidecar stays the authority: submit() does not call validate().
import { status as Status } from "@grpc/grpc-js";
import { GateError, InvalidSubmission, ResourceExhausted } from "./errors.js";
import { REFUSED, REFUSED_REASONS, WHITE_SPACE } from "./gen/refused.js";
import { payloadBytes, type Payload } from "./key.js";

/** The sidecar's default payload limit (ONCEGATE_MAX_PAYLOAD_BYTES). */
export const DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024;
export const MAX_AWARD_ID_CHARS = 128;

/** One delivery's content (DESIGN §1). */
export interface Submission {
  /** 1-128 printable characters, no '|', no leading or trailing white space. */
  awardId: string;
  /** RFC 3339 date-time, used verbatim in the key. */
  submissionTimestamp: string;
  /** Opaque bytes (a string is sent as UTF-8), at most the sidecar's limit. */
  payload: Payload;
  /** Positive amount in cents (a bigint beyond 2^53). */
  amountCents: number | bigint;
  /** The producer's own key (a UUID per intent); absent: derived. */
  idempotencyKey?: string;
}

const invalid = (msg: string) => new InvalidSubmission(Status.INVALID_ARGUMENT, msg);
const hex4 = (cp: number) => cp.toString(16).toUpperCase().padStart(4, "0");

/** The amount as an int64, or undefined when it is not one (1.5, NaN, 2^63):
 * the message's fault, never sent. */
export function amountOf(a: number | bigint): bigint | undefined {
  if (typeof a === "number" && !Number.isSafeInteger(a)) return undefined;
  const n = BigInt(a);
  return n >= -(2n ** 63n) && n < 2n ** 63n ? n : undefined;
}

/** Why an award id may not hold the code point ("control character", ...),
 * or undefined when it may. */
export function refusedAwardIdChar(cp: number): string | undefined {
  let lo = 0;
  let hi = REFUSED.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const [first, last, reason] = REFUSED[mid]!;
    if (cp < first) hi = mid - 1;
    else if (cp > last) lo = mid + 1;
    else return REFUSED_REASONS[reason];
  }
  return undefined;
}

const isWhiteSpace = (cp: number) => WHITE_SPACE.some(([first, last]) => first <= cp && cp <= last);

/** The sidecar's error for a submission, or null when it would accept it.
 * `maxPayloadBytes`: the sidecar's limit. */
export function validate(s: Submission, maxPayloadBytes = DEFAULT_MAX_PAYLOAD_BYTES): GateError | null {
  const award = awardIdProblem(s.awardId);
  if (award) return invalid(award);
  const ts = timestampProblem(s.submissionTimestamp);
  if (ts) return invalid(ts);
  const amount = amountOf(s.amountCents);
  if (amount === undefined) return invalid(`amount_cents must be an int64, got ${String(s.amountCents)}`);
  if (amount <= 0n) return invalid(`amount_cents must be greater than 0, got ${amount}`);
  const size = payloadBytes(s.payload).length;
  if (size > maxPayloadBytes) {
    return new ResourceExhausted(Status.RESOURCE_EXHAUSTED, `payload is ${size} bytes, the limit is ${maxPayloadBytes} bytes`);
  }
  if (s.idempotencyKey !== undefined) {
    const key = keyProblem(s.idempotencyKey);
    if (key) return invalid(key);
  }
  return null;
}

function awardIdProblem(a: string): string | undefined {
  const cps = Array.from(a, (c) => c.codePointAt(0)!);
  if (cps.length === 0) return "award_id is required";
  if (cps.length > MAX_AWARD_ID_CHARS) return `award_id is ${cps.length} characters, at most ${MAX_AWARD_ID_CHARS} allowed`;
  if (a.includes("|")) return "award_id must not contain '|'";
  for (const cp of cps) {
    const why = refusedAwardIdChar(cp);
    if (why) return `award_id must be printable, found ${why} U+${hex4(cp)}`;
  }
  if (isWhiteSpace(cps[0]!) || isWhiteSpace(cps[cps.length - 1]!)) {
    return "award_id must not begin or end with white space";
  }
  return undefined;
}

const TIMESTAMP_FORMAT = "submission_timestamp must be an RFC 3339 date-time (e.g. 2026-11-29T10:57:45Z)";

function timestampProblem(ts: string): string | undefined {
  if (ts === "") return "submission_timestamp is required";
  const b = Buffer.from(ts, "utf8");
  if (b.length > 64) return "submission_timestamp is longer than 64 bytes";
  for (const c of ts) {
    const cp = c.codePointAt(0)!;
    if (cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f)) {
      return `submission_timestamp must not contain control characters, found U+${hex4(cp)}`;
    }
  }
  if (b.length > 10 && b[10] !== 0x54 && b[10] !== 0x74) return `${TIMESTAMP_FORMAT}: date and time must be separated by 'T'`;
  return isRfc3339DateTime(b) ? undefined : TIMESTAMP_FORMAT;
}

/** RFC 3339 §5.6 date-time exactly, on the UTF-8 bytes (as the sidecar). */
function isRfc3339DateTime(b: Buffer): boolean {
  const digits = (from: number, to: number): number | undefined => {
    if (to > b.length) return undefined;
    let n = 0;
    for (let i = from; i < to; i++) {
      if (b[i]! < 0x30 || b[i]! > 0x39) return undefined;
      n = n * 10 + (b[i]! - 0x30);
    }
    return n;
  };
  const [year, month, day] = [digits(0, 4), digits(5, 7), digits(8, 10)];
  const [hour, minute, second] = [digits(11, 13), digits(14, 16), digits(17, 19)];
  if ([year, month, day, hour, minute, second].some((x) => x === undefined)) return false;
  const at = (i: number, c: string) => b[i] === c.charCodeAt(0);
  if (!(at(4, "-") && at(7, "-") && (at(10, "T") || at(10, "t")) && at(13, ":") && at(16, ":"))) return false;
  if (!validDate(year!, month!, day!) || hour! > 23 || minute! > 59 || second! > 60 || (second === 60 && minute !== 59)) {
    return false;
  }
  return validZone(b.subarray(19));
}

function validDate(year: number, month: number, day: number): boolean {
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1];
  return days !== undefined && day >= 1 && day <= days;
}

function validZone(rest: Buffer): boolean {
  const isDigit = (x: number | undefined) => x !== undefined && x >= 0x30 && x <= 0x39;
  if (rest[0] === 0x2e) {
    let n = 1;
    while (isDigit(rest[n])) n++;
    if (n === 1) return false;
    rest = rest.subarray(n);
  }
  if (rest.length === 1 && (rest[0] === 0x5a || rest[0] === 0x7a)) return true;
  if (rest.length !== 6 || (rest[0] !== 0x2b && rest[0] !== 0x2d) || rest[3] !== 0x3a) return false;
  if (![1, 2, 4, 5].every((i) => isDigit(rest[i]))) return false;
  const hh = (rest[1]! - 0x30) * 10 + (rest[2]! - 0x30);
  const mm = (rest[4]! - 0x30) * 10 + (rest[5]! - 0x30);
  return hh <= 23 && mm <= 59;
}

/** A producer's key (or one given to lookup) as the sidecar checks it; the
 * sidecar's message, or undefined when valid. */
export function keyProblem(k: string): string | undefined {
  if (k.length === 0 || Buffer.byteLength(k, "utf8") > 128) return "idempotency_key must be 1 to 128 characters when set";
  if (!/^[A-Za-z0-9_.:-]+$/.test(k)) return "idempotency_key may contain only ASCII letters, digits and - _ . :";
  return undefined;
}
