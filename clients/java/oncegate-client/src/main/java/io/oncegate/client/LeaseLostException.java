package io.oncegate.client;

import io.grpc.Status;

/**
 * FAILED_PRECONDITION "lease lost": an effect's lease token is no longer the
 * record's current lease (it expired and another attempt took it, or it was
 * released). Do not complete: the current holder decides the effect.
 */
public final class LeaseLostException extends GateException {
    private static final long serialVersionUID = 1L;

    LeaseLostException(String message, Throwable cause) {
        super(Status.Code.FAILED_PRECONDITION, message, cause);
    }
}
