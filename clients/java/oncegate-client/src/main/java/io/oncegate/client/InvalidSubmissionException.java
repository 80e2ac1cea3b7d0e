package io.oncegate.client;

import io.grpc.Status;

/** INVALID_ARGUMENT: bad input, nothing written. Do not retry: dead-letter. */
public final class InvalidSubmissionException extends GateException {
    private static final long serialVersionUID = 1L;

    /**
     * A refusal, as the sidecar (or this client's validation) words it.
     *
     * @param message what is wrong, naming the field
     */
    public InvalidSubmissionException(String message) {
        super(Status.Code.INVALID_ARGUMENT, message);
    }

    InvalidSubmissionException(String message, Throwable cause) {
        super(Status.Code.INVALID_ARGUMENT, message, cause);
    }

    @Override
    public boolean isPoison() {
        return true;
    }
}
