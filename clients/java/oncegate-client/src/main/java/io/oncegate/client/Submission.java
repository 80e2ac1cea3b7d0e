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

    /**
     * A submission; {@link #of} for one whose key is derived.
     *
     * @param awardId 1-128 printable characters, no '|', no leading or trailing white space
     * @param submissionTimestamp an RFC 3339 date-time, used verbatim in the key
     * @param payload opaque bytes (never logged), at most the sidecar's limit (1 MiB by default)
     * @param amountCents the amount, greater than 0
     * @param idempotencyKey the producer's own key (1-128 of ASCII letters, digits and - _ . :),
     *     or null for the derived one
     */
    public Submission(String awardId, String submissionTimestamp, byte[] payload, long amountCents,
            String idempotencyKey) {
        this.awardId = Objects.requireNonNull(awardId, "awardId");
        this.submissionTimestamp = Objects.requireNonNull(submissionTimestamp, "submissionTimestamp");
        this.payload = Objects.requireNonNull(payload, "payload");
        this.amountCents = amountCents;
        this.idempotencyKey = idempotencyKey;
    }

    /**
     * A submission whose key is derived.
     *
     * @param awardId the award id
     * @param submissionTimestamp an RFC 3339 date-time, used verbatim in the key
     * @param payload the payload bytes
     * @param amountCents the amount, greater than 0
     * @return the submission
     */
    public static Submission of(String awardId, String submissionTimestamp, byte[] payload, long amountCents) {
        return new Submission(awardId, submissionTimestamp, payload, amountCents, null);
    }

    /**
     * A submission whose key is derived and whose payload is text.
     *
     * @param awardId the award id
     * @param submissionTimestamp an RFC 3339 date-time, used verbatim in the key
     * @param payload the payload, sent as UTF-8
     * @param amountCents the amount, greater than 0
     * @return the submission
     */
    public static Submission of(String awardId, String submissionTimestamp, String payload, long amountCents) {
        return of(awardId, submissionTimestamp, payload.getBytes(StandardCharsets.UTF_8), amountCents);
    }

    /**
     * This submission with the producer's own key.
     *
     * @param key the producer's key (a UUID per intent, say)
     * @return a copy with that key
     */
    public Submission withIdempotencyKey(String key) {
        return new Submission(awardId, submissionTimestamp, payload, amountCents, key);
    }

    /**
     * The award id.
     *
     * @return the award id, as given
     */
    public String awardId() {
        return awardId;
    }

    /**
     * The submission timestamp.
     *
     * @return the timestamp, as given
     */
    public String submissionTimestamp() {
        return submissionTimestamp;
    }

    /**
     * The payload.
     *
     * @return the payload bytes (not copied: do not change them)
     */
    public byte[] payload() {
        return payload;
    }

    /**
     * The amount.
     *
     * @return the amount in cents
     */
    public long amountCents() {
        return amountCents;
    }

    /**
     * The producer's key.
     *
     * @return the producer's key, or null when the key is derived
     */
    public String idempotencyKey() {
        return idempotencyKey;
    }

    /**
     * The key the sidecar will use.
     *
     * @return the producer's key, or the derived one
     */
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
