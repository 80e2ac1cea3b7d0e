package io.oncegate.client;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * The idempotency key of DESIGN §1, byte for byte:
 *
 * <pre>
 * payload_digest = sha256(payload) as lowercase hex
 * key = sha256(utf8(award_id + "|" + submission_timestamp + "|" + payload_digest)) as lowercase hex
 * </pre>
 *
 * <p>64 lowercase hex characters. The timestamp is used verbatim, never
 * normalised; award ids are never Unicode-normalised either. Never derive a
 * key from broker offsets or delivery ids.
 */
public final class IdempotencyKey {
    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);

    private IdempotencyKey() {}

    /**
     * The key the sidecar derives for a submission without a producer key.
     *
     * @param awardId the award id, as sent
     * @param submissionTimestamp the timestamp, verbatim
     * @param payload the payload bytes
     * @return 64 lowercase hex characters
     */
    public static String derive(String awardId, String submissionTimestamp, byte[] payload) {
        MessageDigest sha = sha256();
        sha.update(Text.utf8("award_id", awardId));
        sha.update((byte) '|');
        sha.update(Text.utf8("submission_timestamp", submissionTimestamp));
        sha.update((byte) '|');
        sha.update(payloadDigest(payload).getBytes(StandardCharsets.US_ASCII));
        return hex(sha.digest());
    }

    /**
     * The payload's digest, as the key uses it.
     *
     * @param payload the payload bytes
     * @return lowercase hex SHA-256 of {@code payload}
     */
    public static String payloadDigest(byte[] payload) {
        return hex(sha256().digest(payload));
    }

    static String hex(byte[] digest) {
        byte[] out = new byte[digest.length * 2];
        for (int i = 0; i < digest.length; i++) {
            out[2 * i] = HEX[(digest[i] >> 4) & 0xF];
            out[2 * i + 1] = HEX[digest[i] & 0xF];
        }
        return new String(out, StandardCharsets.US_ASCII);
    }

    private static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every Java runtime has SHA-256", e);
        }
    }
}
