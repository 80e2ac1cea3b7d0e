export { Gate, DEFAULT_TARGET, DEFAULT_TIMEOUT_MS, EFFECT_MAX_BYTES } from "./client.js";
export type { Begun, CallOptions, Decision, Disbursement, GateOptions, Outcome, Tier } from "./client.js";
export * from "./errors.js";
export { deriveIdempotencyKey, payloadDigest, payloadBytes, type Payload } from "./key.js";
export { validate, keyProblem, refusedAwardIdChar, DEFAULT_MAX_PAYLOAD_BYTES, MAX_AWARD_ID_CHARS, type Submission } from "./validate.js";
export { stubClass, serviceDefinition } from "./stub.js";
export { UNICODE_VERSION } from "./gen/refused.js";
