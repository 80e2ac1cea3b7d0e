package io.oncegate.client;

/**
 * The sidecar's answer to a delivery: CLAIMED (first time, committed now) or
 * DUPLICATE (committed before), with the stored disbursement, identical on
 * the first call and every duplicate. Either way: acknowledge the broker.
 */
public record Decision(Outcome outcome, String idempotencyKey, Disbursement disbursement, Tier decidedBy) {
    public enum Outcome { CLAIMED, DUPLICATE }

    /** The tier that answered. */
    public enum Tier { LOCAL_CACHE, REDIS, DATABASE }

    public boolean isClaimed() {
        return outcome == Outcome.CLAIMED;
    }

    public boolean isDuplicate() {
        return outcome == Outcome.DUPLICATE;
    }
}
