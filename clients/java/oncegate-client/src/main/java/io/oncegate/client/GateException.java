package io.oncegate.client;

import io.grpc.Status;

/**
 * The sidecar (or the transport, or this client's own validation) refused or
 * failed a call. The consumer's rule (DESIGN §1): acknowledge the broker only
 * after a {@link Decision}; on any {@code GateException} do not acknowledge.
 *
 * <p>{@link #isPoison()}: the error is about this message and no retry can
 * succeed: dead-letter it (and then acknowledge it). {@link #isRetryable()}:
 * transient: leave it unacknowledged so the broker redelivers it, and the next
 * {@code submit} resolves it. Neither: a deployment problem (an unknown method,
 * no permission): do not acknowledge, back off, alert.
 *
 * <p>The subclass for each status code is chosen in one place,
 * {@link GateErrors#forStatus}; the table is the Python client's.
 */
public class GateException extends Exception {
    private static final long serialVersionUID = 1L;

    /** The gRPC status code. */
    private final Status.Code code;
    /** The status message as the sidecar sent it. */
    private final String serverMessage;

    /**
     * An error with a status code and the sidecar's message.
     *
     * @param code the gRPC status code
     * @param message the status message (names the field or cause)
     */
    public GateException(Status.Code code, String message) {
        this(code, message, null);
    }

    /**
     * As {@link #GateException(Status.Code, String)}, with its cause.
     *
     * @param code the gRPC status code
     * @param message the status message
     * @param cause what grpc-java threw, or null
     */
    public GateException(Status.Code code, String message, Throwable cause) {
        super(code + ": " + message, cause);
        this.code = code;
        this.serverMessage = message;
    }

    /**
     * The gRPC status code.
     *
     * @return the code the sidecar (or the transport, or the client's validation) gave
     */
    public Status.Code code() {
        return code;
    }

    /**
     * The status message as the sidecar sent it.
     *
     * @return the message, naming the field or cause; empty when there was none
     */
    public String serverMessage() {
        return serverMessage;
    }

    /**
     * Whether a redelivery (or a retry) can succeed: then do not acknowledge.
     *
     * @return true for {@link RetryableException} and its subclasses
     */
    public boolean isRetryable() {
        return false;
    }

    /**
     * Whether this message can never succeed: then dead-letter it, and acknowledge it.
     *
     * @return true for {@link InvalidSubmissionException}, {@link KeyReusedException} and
     *     {@link TooLargeException}
     */
    public boolean isPoison() {
        return false;
    }
}
