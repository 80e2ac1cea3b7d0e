package io.oncegate.client;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Objects;

/**
 * One delivery to decide. {@code idempotencyKey} is the producer's own key
 * (a UUID per intent), or null for the key derived from award id, timestamp
 * and payload ({@link IdempotencyKey#derive}).
 */
public final class Submission {
    private final String awardId;
    private final String submissionTimestamp;
    private final byte[] payload;
    private final long amountCents;
    private final String idempotencyKey;

    public Submission(String awardId, String submissionTimestamp, byte[] payload, long amountCents,
            String idempotencyKey) {
        this.awardId = Objects.requireNonNull(awardId, "awardId");
        this.submissionTimestamp = Objects.requireNonNull(submissionTimestamp, "submissionTimestamp");
        this.payload = Objects.requireNonNull(payload, "payload");
        this.amountCents = amountCents;
        this.idempotencyKey = idempotencyKey;
    }

    /** A submission whose key is derived. */
    public static Submission of(String awardId, String submissionTimestamp, byte[] payload, long amountCents) {
        return new Submission(awardId, submissionTimestamp, payload, amountCents, null);
    }

    /** A submission whose payload is {@code payload} as UTF-8. */
    public static Submission of(String awardId, String submissionTimestamp, String payload, long amountCents) {
        return of(awardId, submissionTimestamp, payload.getBytes(StandardCharsets.UTF_8), amountCents);
    }

    /** This submission with the producer's own key. */
    public Submission withIdempotencyKey(String key) {
        return new Submission(awardId, submissionTimestamp, payload, amountCents, key);
    }

    public String awardId() {
        return awardId;
    }

    public String submissionTimestamp() {
        return submissionTimestamp;
    }

    /** The payload bytes (not copied: do not change them). */
    public byte[] payload() {
        return payload;
    }

    public long amountCents() {
        return amountCents;
    }

    /** The producer's key, or null. */
    public String idempotencyKey() {
        return idempotencyKey;
    }

    /** The key the sidecar will use: the producer's, or the derived one. */
    public String key() {
        return idempotencyKey != null ? idempotencyKey : IdempotencyKey.derive(awardId, submissionTimestamp, payload);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Submission s && awardId.equals(s.awardId)
                && submissionTimestamp.equals(s.submissionTimestamp) && Arrays.equals(payload, s.payload)
                && amountCents == s.amountCents && Objects.equals(idempotencyKey, s.idempotencyKey);
    }

    @Override
    public int hashCode() {
        return Objects.hash(awardId, submissionTimestamp, Arrays.hashCode(payload), amountCents, idempotencyKey);
    }

    /** Never the payload: payloads are not logged. */
    @Override
    public String toString() {
        return "Submission[awardId=" + awardId + ", submissionTimestamp=" + submissionTimestamp + ", payload="
                + payload.length + " bytes, amountCents=" + amountCents
                + (idempotencyKey != null ? ", idempotencyKey=" + idempotencyKey : "") + "]";
    }
}
