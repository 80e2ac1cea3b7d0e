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

    private final Status.Code code;
    private final String serverMessage;

    public GateException(Status.Code code, String message) {
        this(code, message, null);
    }

    public GateException(Status.Code code, String message, Throwable cause) {
        super(code + ": " + message, cause);
        this.code = code;
        this.serverMessage = message;
    }

    /** The gRPC status code. */
    public Status.Code code() {
        return code;
    }

    /** The status message as the sidecar sent it (it names the field or cause). */
    public String serverMessage() {
        return serverMessage;
    }

    /** A redelivery (or a retry) can succeed: do not acknowledge. */
    public boolean isRetryable() {
        return false;
    }

    /** This message can never succeed: dead-letter it, then acknowledge it. */
    public boolean isPoison() {
        return false;
    }
}
