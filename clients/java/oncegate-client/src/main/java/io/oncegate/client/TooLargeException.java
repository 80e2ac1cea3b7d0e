package io.oncegate.client;

import io.grpc.Status;

/**
 * RESOURCE_EXHAUSTED over a size limit of an effect call: its request or
 * response is over 1 MiB (checked before sending), or the whole message is
 * over the sidecar's message limit. No retry fixes it: dead-letter. (An
 * effect call over the in-flight limit stays {@link RetryableException.ResourceExhausted}.)
 */
public final class TooLargeException extends GateException {
    private static final long serialVersionUID = 1L;

    TooLargeException(String message, Throwable cause) {
        super(Status.Code.RESOURCE_EXHAUSTED, message, cause);
    }

    @Override
    public boolean isPoison() {
        return true;
    }
}
