package io.oncegate.client;

import io.grpc.Status;

/**
 * FAILED_PRECONDITION: the idempotency key was already used for a different
 * submission (award id, amount or payload differ), or an effect's key with a
 * different request. Do not retry: dead-letter and investigate the producer.
 */
public final class KeyReusedException extends GateException {
    private static final long serialVersionUID = 1L;

    KeyReusedException(String message, Throwable cause) {
        super(Status.Code.FAILED_PRECONDITION, message, cause);
    }

    @Override
    public boolean isPoison() {
        return true;
    }
}
