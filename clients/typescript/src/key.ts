import { createHash } from "node:crypto";

/** Bytes as sent and hashed: a string is UTF-8. */
export type Payload = Uint8Array | string;

export function payloadBytes(payload: Payload): Uint8Array {
  return typeof payload === "string" ? new TextEncoder().encode(payload) : payload;
}

/** Lowercase hex SHA-256 of the payload. */
export function payloadDigest(payload: Payload): string {
  return createHash("sha256").update(payloadBytes(payload)).digest("hex");
}

/** The key the sidecar derives for a submission without a key of its own,
 * byte for byte (DESIGN §1):
 * `sha256("{award_id}|{submission_timestamp}|{sha256(payload) hex}")` hex.
 * The timestamp is used verbatim. Strings are hashed as UTF-8 (a lone
 * surrogate would become U+FFFD: validate() refuses one first). */
export function deriveIdempotencyKey(awardId: string, submissionTimestamp: string, payload: Payload): string {
  return createHash("sha256")
    .update(`${awardId}|${submissionTimestamp}|${payloadDigest(payload)}`, "utf8")
    .digest("hex");
}
