package io.oncegate.client;

import io.grpc.Status;

/**
 * Transient: do not acknowledge; the broker's redelivery (or a retry)
 * resolves it. ABORTED, INTERNAL, UNKNOWN and CANCELLED are this class
 * itself; the named cases are its subclasses.
 */
public class RetryableException extends GateException {
    private static final long serialVersionUID = 1L;

    RetryableException(Status.Code code, String message, Throwable cause) {
        super(code, message, cause);
    }

    @Override
    public final boolean isRetryable() {
        return true;
    }

    /** UNAVAILABLE: the sidecar or its authoritative store is unreachable. */
    public static final class Unavailable extends RetryableException {
        private static final long serialVersionUID = 1L;

        Unavailable(String message, Throwable cause) {
            super(Status.Code.UNAVAILABLE, message, cause);
        }
    }

    /**
     * RESOURCE_EXHAUSTED: over the in-flight limit (back off), or a Submit's
     * payload over the sidecar's configured limit (cap redeliveries: it will
     * not succeed until the limit is raised).
     */
    public static final class ResourceExhausted extends RetryableException {
        private static final long serialVersionUID = 1L;

        ResourceExhausted(String message, Throwable cause) {
            super(Status.Code.RESOURCE_EXHAUSTED, message, cause);
        }
    }

    /**
     * DEADLINE_EXCEEDED: the call's deadline passed; the outcome may still
     * commit, and the next Submit of the same delivery says which.
     */
    public static final class DeadlineExceeded extends RetryableException {
        private static final long serialVersionUID = 1L;

        DeadlineExceeded(String message, Throwable cause) {
            super(Status.Code.DEADLINE_EXCEEDED, message, cause);
        }
    }
}
