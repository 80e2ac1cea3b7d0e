package io.oncegate.client;

import com.google.protobuf.ByteString;
import oncegate.v1.EffectsOuterClass;
import oncegate.v1.GateOuterClass;

/** Between the generated messages and this client's types. */
final class Convert {
    private Convert() {}

    static GateOuterClass.Submission submission(Submission s) {
        GateOuterClass.Submission.Builder b = GateOuterClass.Submission.newBuilder()
                .setAwardId(s.awardId())
                .setSubmissionTimestamp(s.submissionTimestamp())
                .setPayload(ByteString.copyFrom(s.payload()))
                .setAmountCents(s.amountCents());
        if (s.idempotencyKey() != null) {
            b.setIdempotencyKey(s.idempotencyKey());
        }
        return b.build();
    }

    static Decision decision(GateOuterClass.Decision d) throws GateException {
        Decision.Outcome outcome;
        switch (d.getOutcome()) {
            case CLAIMED:
                outcome = Decision.Outcome.CLAIMED;
                break;
            case DUPLICATE:
                outcome = Decision.Outcome.DUPLICATE;
                break;
            default:
                throw GateErrors.forStatus(io.grpc.Status.Code.UNKNOWN, "sidecar answered outcome " + d.getOutcome());
        }
        if (!d.hasDisbursement()) {
            // The sidecar always sends it: a Decision without one is not an answer to act on.
            throw GateErrors.forStatus(io.grpc.Status.Code.UNKNOWN, "sidecar answered a Decision without its disbursement");
        }
        GateOuterClass.Disbursement r = d.getDisbursement();
        Disbursement disbursement = new Disbursement(r.getId(), r.getAwardId(), r.getAmountCents(), r.getRecordedAt(),
                r.getSequence());
        return new Decision(outcome, d.getIdempotencyKey(), disbursement, tier(d.getDecidedBy()));
    }

    static Decision.Tier tier(GateOuterClass.Tier t) {
        switch (t) {
            case LOCAL_CACHE:
                return Decision.Tier.LOCAL_CACHE;
            case REDIS:
                return Decision.Tier.REDIS;
            default:
                return Decision.Tier.DATABASE;
        }
    }

    static BatchResult batchResult(GateOuterClass.Result r) {
        switch (r.getResultCase()) {
            case DECISION:
                try {
                    return new BatchResult(decision(r.getDecision()), null);
                } catch (GateException e) {
                    return new BatchResult(null, e);
                }
            case ERROR:
                return new BatchResult(null, GateErrors.forStatus(r.getError().getCode(), r.getError().getMessage()));
            default:
                return new BatchResult(null,
                        GateErrors.forStatus(io.grpc.Status.Code.UNKNOWN, "sidecar returned an empty result"));
        }
    }

    static Begun begun(EffectsOuterClass.BeginResponse r) throws GateException {
        switch (r.getOutcomeCase()) {
            case ACQUIRED:
                return new Begun.Acquired(r.getAcquired().getLeaseToken(), r.getAcquired().getAttempt());
            case COMPLETED:
                EffectsOuterClass.Completed c = r.getCompleted();
                return new Begun.Completed(c.getResponse().toByteArray(), c.getCompletedAt(), c.getAttempt(),
                        tier(c.getDecidedBy()));
            default:
                throw GateErrors.forStatus(io.grpc.Status.Code.UNKNOWN, "sidecar answered Begin without an outcome");
        }
    }

    /** A release reason from an exception: printable, at most 256 characters. */
    static String reason(Exception e) {
        String text = e.getClass().getSimpleName() + (e.getMessage() != null ? ": " + e.getMessage() : "");
        StringBuilder out = new StringBuilder();
        text.codePoints()
                .filter(cp -> Character.getType(cp) != Character.CONTROL && !Character.isSurrogate((char) cp))
                .limit(256)
                .forEach(out::appendCodePoint);
        return out.toString();
    }
}
