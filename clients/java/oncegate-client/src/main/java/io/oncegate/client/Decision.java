package io.oncegate.client;

/**
 * The sidecar's answer to a delivery: what {@link GateClient#submit(Submission)}
 * returns, and {@link GateClient#lookup(String)} finds. CLAIMED (the first
 * delivery: the disbursement was committed by this call) or DUPLICATE
 * (committed before: the stored original is returned), with the same
 * disbursement either way. Either way: acknowledge the broker.
 *
 * @param outcome CLAIMED or DUPLICATE
 * @param idempotencyKey the key the sidecar used: derived ({@link IdempotencyKey#derive}, 64
 *     lowercase hex characters) or the producer's own
 * @param disbursement the ledger row the first delivery wrote, identical on every duplicate;
 *     never null
 * @param decidedBy the tier that answered
 */
public record Decision(Outcome outcome, String idempotencyKey, Disbursement disbursement, Tier decidedBy) {
    /** What a delivery was. */
    public enum Outcome {
        /** The first delivery of this key: its disbursement was committed by this call. */
        CLAIMED,
        /** Committed before (by an earlier delivery, here or in another pod): nothing new was written. */
        DUPLICATE
    }

    /** The tier that answered. */
    public enum Tier {
        /** This sidecar's in-process cache (a duplicate it had seen). */
        LOCAL_CACHE,
        /** The shared Redis cache (a duplicate another sidecar had seen). */
        REDIS,
        /** The authoritative store: every CLAIMED, and duplicates no cache held. */
        DATABASE
    }

    /**
     * Whether this call committed the disbursement.
     *
     * @return {@code outcome == CLAIMED}
     */
    public boolean isClaimed() {
        return outcome == Outcome.CLAIMED;
    }

    /**
     * Whether the disbursement was committed before this call.
     *
     * @return {@code outcome == DUPLICATE}
     */
    public boolean isDuplicate() {
        return outcome == Outcome.DUPLICATE;
    }
}
