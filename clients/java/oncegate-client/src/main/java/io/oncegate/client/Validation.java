package io.oncegate.client;

import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * The sidecar's validation, in Java: the same rules in the same order, the
 * same status codes and byte-for-byte the same messages (checked against the
 * shared vectors in {@code clients/vectors/}). {@link GateClient} runs it
 * before sending, so a bad message is refused without a round trip.
 *
 * <p><b>The sidecar stays the authority</b>: whatever passes here is checked
 * again there, and a sidecar configured with other limits (a larger payload
 * limit, say) answers for itself. Limits the sidecar's configuration sets
 * (the payload size, the batch size) are checked here only when given.
 */
public final class Validation {
    /** The longest award id, in characters (code points). */
    public static final int MAX_AWARD_ID_CHARS = 128;
    /** The largest effect request and response, and the sidecar's default payload limit. */
    public static final int MAX_EFFECT_BYTES = 1024 * 1024;
    /** The longest effect lease. */
    public static final Duration MAX_LEASE_TTL = Duration.ofMinutes(15);

    private static final String TIMESTAMP_FORMAT =
            "submission_timestamp must be an RFC 3339 date-time (e.g. 2026-11-29T10:57:45Z)";
    private static final int MAX_TIMESTAMP_BYTES = 64;
    private static final int MAX_KEY_BYTES = 128;
    private static final int MAX_NAMESPACE_BYTES = 64;
    private static final int MAX_TOKEN_BYTES = 64;
    private static final int MAX_REASON_CHARS = 256;

    private Validation() {}

    /**
     * Checks a submission as the sidecar does: award id, timestamp, amount,
     * payload size (only when {@code maxPayloadBytes} &gt; 0), producer key.
     *
     * @param s the submission
     * @param maxPayloadBytes the sidecar's {@code ONCEGATE_MAX_PAYLOAD_BYTES}, or 0 to leave the size to it
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkSubmission(Submission s, long maxPayloadBytes) throws GateException {
        checkAwardId(s.awardId());
        checkTimestamp(s.submissionTimestamp());
        if (s.amountCents() <= 0) {
            throw invalid("amount_cents must be greater than 0, got " + s.amountCents());
        }
        if (maxPayloadBytes > 0 && s.payload().length > maxPayloadBytes) {
            throw new RetryableException.ResourceExhausted(String.format(
                    "payload is %d bytes, the limit is %d bytes", s.payload().length, maxPayloadBytes), null);
        }
        if (s.idempotencyKey() != null) {
            checkProducerKey(s.idempotencyKey());
        }
    }

    static void checkAwardId(String awardId) throws GateException {
        refuseUnpaired("award_id", awardId);
        int chars = awardId.codePointCount(0, awardId.length());
        if (chars == 0) {
            throw invalid("award_id is required");
        }
        if (chars > MAX_AWARD_ID_CHARS) {
            throw invalid("award_id is " + chars + " characters, at most " + MAX_AWARD_ID_CHARS + " allowed");
        }
        if (awardId.indexOf('|') >= 0) {
            throw invalid("award_id must not contain '|'");
        }
        for (int i = 0; i < awardId.length(); ) {
            int cp = awardId.codePointAt(i);
            String refusal = RefusedChars.refusal(cp);
            if (refusal != null) {
                throw invalid(String.format("award_id must be printable, found %s U+%04X", refusal, cp));
            }
            i += Character.charCount(cp);
        }
        int first = awardId.codePointAt(0);
        int last = awardId.codePointBefore(awardId.length());
        if (RefusedChars.isWhiteSpace(first) || RefusedChars.isWhiteSpace(last)) {
            throw invalid("award_id must not begin or end with white space");
        }
    }

    static void checkTimestamp(String ts) throws GateException {
        refuseUnpaired("submission_timestamp", ts);
        if (ts.isEmpty()) {
            throw invalid("submission_timestamp is required");
        }
        byte[] b = ts.getBytes(StandardCharsets.UTF_8);
        if (b.length > MAX_TIMESTAMP_BYTES) {
            throw invalid("submission_timestamp is longer than 64 bytes");
        }
        for (int i = 0; i < ts.length(); ) {
            int cp = ts.codePointAt(i);
            if (Character.getType(cp) == Character.CONTROL) {
                throw invalid(String.format(
                        "submission_timestamp must not contain control characters, found U+%04X", cp));
            }
            i += Character.charCount(cp);
        }
        if (b.length > 10 && b[10] != 'T' && b[10] != 't') {
            throw invalid(TIMESTAMP_FORMAT + ": date and time must be separated by 'T'");
        }
        if (!Rfc3339.isDateTime(b)) {
            throw invalid(TIMESTAMP_FORMAT);
        }
    }

    /**
     * Checks a producer's idempotency key (Submit) or a Lookup key: 1-128 of ASCII letters, digits and - _ . :
     *
     * @param key the key
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkProducerKey(String key) throws GateException {
        int bytes = utf8Length(key);
        if (bytes == 0 || bytes > MAX_KEY_BYTES) {
            throw invalid("idempotency_key must be 1 to 128 characters when set");
        }
        for (int i = 0; i < key.length(); i++) {
            char c = key.charAt(i);
            if (!(isAsciiAlphanumeric(c) || c == '-' || c == '_' || c == '.' || c == ':')) {
                throw invalid("idempotency_key may contain only ASCII letters, digits and - _ . :");
            }
        }
    }

    /**
     * Checks an effect's namespace: 1-64 of [a-z0-9._-].
     *
     * @param ns the namespace
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkNamespace(String ns) throws GateException {
        if (ns.isEmpty()) {
            throw invalid("namespace is required");
        }
        // Measured in bytes, reported in characters: as the sidecar does.
        if (utf8Length(ns) > MAX_NAMESPACE_BYTES) {
            throw invalid("namespace is " + ns.codePointCount(0, ns.length()) + " characters, at most "
                    + MAX_NAMESPACE_BYTES + " allowed");
        }
        for (int i = 0; i < ns.length(); i++) {
            char c = ns.charAt(i);
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
                throw invalid("namespace may contain only lowercase ASCII letters, digits and . _ -");
            }
        }
    }

    /**
     * Checks an effect's key: required, then as a producer key.
     *
     * @param key the key
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkEffectKey(String key) throws GateException {
        if (key.isEmpty()) {
            throw invalid("idempotency_key is required");
        }
        checkProducerKey(key);
    }

    /**
     * Checks a Begin: namespace, key, request size, lease TTL.
     *
     * @param namespace the effect's namespace
     * @param key the effect's key
     * @param request the request bytes (at most 1 MiB)
     * @param leaseTtl the lease's time to live (at most 15 minutes), or null for the sidecar's default
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkBegin(String namespace, String key, byte[] request, Duration leaseTtl)
            throws GateException {
        checkBegin(namespace, key, request, leaseTtl == null ? null : leaseTtl.getSeconds(),
                leaseTtl == null ? 0 : leaseTtl.getNano());
    }

    /** Begin with the lease TTL in its wire form (seconds null: none set). */
    static void checkBegin(String namespace, String key, byte[] request, Long ttlSeconds, int ttlNanos)
            throws GateException {
        checkNamespace(namespace);
        checkEffectKey(key);
        checkEffectSize("request", request);
        if (ttlSeconds != null) {
            checkLeaseTtl(ttlSeconds, ttlNanos);
        }
    }

    /**
     * Checks a lease TTL in its wire form (google.protobuf.Duration).
     *
     * @param seconds the duration's seconds
     * @param nanos the duration's nanoseconds
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkLeaseTtl(long seconds, int nanos) throws GateException {
        if (seconds < 0 || nanos < 0 || (seconds == 0 && nanos == 0)) {
            throw invalid("lease_ttl must be greater than 0");
        }
        int n = Math.min(nanos, 999_999_999);
        if (seconds > MAX_LEASE_TTL.getSeconds() || (seconds == MAX_LEASE_TTL.getSeconds() && n > 0)) {
            throw invalid("lease_ttl is " + HumanDuration.format(seconds, n) + ", at most 15m allowed");
        }
    }

    /**
     * Checks a Complete: response size, then namespace, key and lease token.
     *
     * @param namespace the effect's namespace
     * @param key the effect's key
     * @param leaseToken the token Begin gave
     * @param response the response bytes (at most 1 MiB)
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkComplete(String namespace, String key, String leaseToken, byte[] response)
            throws GateException {
        checkEffectSize("response", response);
        checkFenced(namespace, key, leaseToken);
    }

    /**
     * Checks a Release: the reason, then namespace, key and lease token.
     *
     * @param namespace the effect's namespace
     * @param key the effect's key
     * @param leaseToken the token Begin gave
     * @param reason why (at most 256 characters, no control characters)
     * @throws GateException the error the sidecar would give, code and message byte for byte
     */
    public static void checkRelease(String namespace, String key, String leaseToken, String reason)
            throws GateException {
        refuseUnpaired("reason", reason);
        if (reason.codePointCount(0, reason.length()) > MAX_REASON_CHARS) {
            throw invalid("reason is longer than " + MAX_REASON_CHARS + " characters");
        }
        if (reason.codePoints().anyMatch(cp -> Character.getType(cp) == Character.CONTROL)) {
            throw invalid("reason must not contain control characters");
        }
        checkFenced(namespace, key, leaseToken);
    }

    static void checkFenced(String namespace, String key, String token) throws GateException {
        checkNamespace(namespace);
        checkEffectKey(key);
        if (token.isEmpty()) {
            throw invalid("lease_token is required");
        }
        boolean alnum = token.chars().allMatch(c -> isAsciiAlphanumeric((char) c));
        if (utf8Length(token) > MAX_TOKEN_BYTES || !alnum) {
            throw invalid("lease_token is not a token Begin issued (at most 64 ASCII letters and digits)");
        }
    }

    /** RESOURCE_EXHAUSTED over 1 MiB, naming the field and both sizes. */
    static void checkEffectSize(String field, byte[] body) throws GateException {
        if (body.length > MAX_EFFECT_BYTES) {
            throw new TooLargeException(String.format(
                    "%s is %d bytes, the limit is %d bytes", field, body.length, MAX_EFFECT_BYTES), null);
        }
    }

    private static void refuseUnpaired(String field, String s) throws GateException {
        int at = Text.unpairedSurrogate(s);
        if (at >= 0) {
            // No UTF-8 form: it could never reach the sidecar as written.
            throw invalid(String.format("%s is not valid Unicode: unpaired surrogate U+%04X", field,
                    (int) s.charAt(at)));
        }
    }

    private static boolean isAsciiAlphanumeric(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    }

    private static int utf8Length(String s) {
        int n = 0;
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c < 0x80) {
                n += 1;
            } else if (c < 0x800) {
                n += 2;
            } else if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                n += 4;
                i++;
            } else {
                n += 3;
            }
        }
        return n;
    }

    private static InvalidSubmissionException invalid(String message) {
        return new InvalidSubmissionException(message);
    }
}
