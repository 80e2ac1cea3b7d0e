package io.oncegate.client;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.regex.Pattern;

/**
 * The one mapping from a gRPC status to a {@link GateException}: the same
 * table as the Python client's {@code oncegate.errors}.
 *
 * <pre>
 * INVALID_ARGUMENT     InvalidSubmissionException     poison: dead-letter
 * FAILED_PRECONDITION  KeyReusedException             poison: dead-letter
 *                      LeaseLostException ("lease lost", effects)
 * UNAVAILABLE          RetryableException.Unavailable       retry
 * RESOURCE_EXHAUSTED   RetryableException.ResourceExhausted retry with backoff
 *                      TooLargeException (an effect call's size refusal): dead-letter
 * DEADLINE_EXCEEDED    RetryableException.DeadlineExceeded  retry
 * ABORTED, INTERNAL, UNKNOWN, CANCELLED  RetryableException retry
 * anything else        GateException                  a deployment problem
 * </pre>
 */
public final class GateErrors {
    // A size in the message: the sidecar's "request is N bytes, the limit is M
    // bytes", the transport's "... larger than max (N vs. M)".
    private static final Pattern SIZE_MESSAGE = Pattern.compile("bytes, the limit is|larger than max");

    private GateErrors() {}

    /**
     * The exception for a status code and message.
     *
     * @param code the gRPC status code
     * @param message the status message (names the field or cause)
     * @return the subclass the table above gives for {@code code}
     */
    public static GateException forStatus(Status.Code code, String message) {
        return forStatus(code, message, null);
    }

    /**
     * As {@link #forStatus(Status.Code, String)} for a per-item error's wire code number.
     *
     * @param code the gRPC status code's number (an unknown number is UNKNOWN)
     * @param message the status message
     * @return the subclass the table above gives for {@code code}
     */
    public static GateException forStatus(int code, String message) {
        Status.Code c = code >= 0 && code < Status.Code.values().length
                ? Status.fromCodeValue(code).getCode()
                : Status.Code.UNKNOWN;
        return forStatus(c, message, null);
    }

    static GateException forStatus(Status.Code code, String message, Throwable cause) {
        String m = message == null ? "" : message;
        switch (code) {
            case INVALID_ARGUMENT:
                return new InvalidSubmissionException(m, cause);
            case FAILED_PRECONDITION:
                return m.startsWith("lease lost") ? new LeaseLostException(m, cause) : new KeyReusedException(m, cause);
            case UNAVAILABLE:
                return new RetryableException.Unavailable(m, cause);
            case RESOURCE_EXHAUSTED:
                return new RetryableException.ResourceExhausted(m, cause);
            case DEADLINE_EXCEEDED:
                return new RetryableException.DeadlineExceeded(m, cause);
            case ABORTED:
            case INTERNAL:
            case UNKNOWN:
            case CANCELLED:
                return new RetryableException(code, m, cause);
            default:
                return new GateException(code, m, cause);
        }
    }

    /**
     * The exception for a failed call.
     *
     * @param e what grpc-java threw
     * @return the subclass for its status, with {@code e} as its cause
     */
    public static GateException fromGrpc(StatusRuntimeException e) {
        Status s = e.getStatus();
        String message = s.getDescription() != null ? s.getDescription() : "";
        return forStatus(s.getCode(), message, e);
    }

    /** An effect call's error: a size refusal is {@link TooLargeException}. */
    static GateException effectError(GateException e) {
        if (e.getClass() == RetryableException.ResourceExhausted.class
                && SIZE_MESSAGE.matcher(e.serverMessage()).find()) {
            return new TooLargeException(e.serverMessage(), e.getCause());
        }
        return e;
    }
}
