package io.oncegate.client;

import com.google.protobuf.ByteString;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.stub.ClientCalls;
import io.grpc.MethodDescriptor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import oncegate.v1.EffectsGrpc;
import oncegate.v1.EffectsOuterClass;
import oncegate.v1.GateGrpc;
import oncegate.v1.GateOuterClass;

/**
 * The oncegate sidecar's client: {@code submit}, {@code submitBatch},
 * {@code lookup} and the Effects calls, each with a deadline, each failure a
 * {@link GateException} that says whether to retry or to dead-letter.
 *
 * <pre>{@code
 * try (GateClient gate = GateClient.connect("127.0.0.1:50051")) {
 *     Decision d = gate.submit(Submission.of(awardId, timestamp, payload, amountCents));
 *     // CLAIMED or DUPLICATE: acknowledge the broker
 * } catch (GateException e) {
 *     // e.isPoison(): dead-letter, then acknowledge; otherwise do not acknowledge
 * }
 * }</pre>
 *
 * <p>Requests are validated here first ({@link Validation}, the sidecar's
 * own rules and messages), so a bad message is refused without a round trip;
 * the sidecar checks again and stays the authority. Thread-safe: share one
 * client (one HTTP/2 channel) across threads.
 */
public final class GateClient implements AutoCloseable {
    /** The sidecar's default address: it listens on its pod's loopback only. */
    public static final String DEFAULT_TARGET = "127.0.0.1:50051";
    /** The default per-call deadline: an expired call is retryable, it never hangs the loop. */
    public static final Duration DEFAULT_DEADLINE = Duration.ofSeconds(10);

    private static final Metadata.Key<String> TRACEPARENT =
            Metadata.Key.of("traceparent", Metadata.ASCII_STRING_MARSHALLER);

    private final ManagedChannel ownedChannel;
    private final Channel channel;
    private final long deadlineNanos;
    private final long maxPayloadBytes;
    private final boolean validate;

    private GateClient(Builder b) {
        this.ownedChannel = b.channel == null ? open(b.target) : null;
        this.channel = b.channel != null ? b.channel : ownedChannel;
        this.deadlineNanos = b.deadline.toNanos();
        this.maxPayloadBytes = b.maxPayloadBytes;
        this.validate = b.validate;
    }

    /**
     * A client of the sidecar at {@code target} with the default settings. The
     * connection is made on the first call, not here.
     *
     * @param target {@code host:port} or {@code http://host:port} (plaintext), {@code https://host:port} (TLS)
     * @return the client; close it when done
     */
    public static GateClient connect(String target) {
        return builder().target(target).build();
    }

    /**
     * Settings other than the defaults: target, deadline, a channel of your own.
     *
     * @return a builder with the defaults ({@value #DEFAULT_TARGET}, 10 s)
     */
    public static Builder builder() {
        return new Builder();
    }

    /** {@code host:port} or {@code http://host:port} (plaintext), {@code https://host:port} (TLS). */
    static ManagedChannel open(String target) {
        String t = target;
        boolean tls = false;
        if (t.startsWith("http://")) {
            t = t.substring("http://".length());
        } else if (t.startsWith("https://")) {
            t = t.substring("https://".length());
            tls = true;
        }
        while (t.endsWith("/")) {
            t = t.substring(0, t.length() - 1);
        }
        ManagedChannelBuilder<?> mb = ManagedChannelBuilder.forTarget(t).maxInboundMessageSize(64 << 20);
        return (tls ? mb.useTransportSecurity() : mb.usePlaintext()).build();
    }

    // -- Gate ----------------------------------------------------------------

    /**
     * Decides one delivery: {@code Gate.Submit}. Acknowledge the broker only
     * after this returned.
     *
     * @param s the delivery
     * @return the {@link Decision}: CLAIMED (committed by this call) or DUPLICATE (committed
     *     before), its key, the disbursement the first delivery wrote (the same on every
     *     duplicate, never null) and the tier that answered
     * @throws GateException the sidecar's refusal or the call's failure: {@link GateException#isPoison()}
     *     dead-letter, {@link GateException#isRetryable()} do not acknowledge (redelivered), neither
     *     a deployment problem
     */
    public Decision submit(Submission s) throws GateException {
        return submit(s, null);
    }

    /**
     * As {@link #submit(Submission)}, continuing the W3C trace
     * {@code traceparent} (the broker message's header, say): the sidecar's
     * span and the outbox event carry it on.
     *
     * @param s the delivery
     * @param traceparent a W3C {@code traceparent}, or null
     * @return the {@link Decision}, as {@link #submit(Submission)}
     * @throws GateException the sidecar's refusal or the call's failure: {@link GateException#isPoison()}
     *     dead-letter, {@link GateException#isRetryable()} do not acknowledge (redelivered), neither
     *     a deployment problem
     */
    public Decision submit(Submission s, String traceparent) throws GateException {
        if (validate) {
            Validation.checkSubmission(s, maxPayloadBytes);
        }
        return Convert.decision(call(GateGrpc.getSubmitMethod(), Convert.submission(s), traceparent));
    }

    /**
     * Decides one delivery whose key is derived: {@link #submit(Submission)} of
     * {@link Submission#of(String, String, byte[], long)}.
     *
     * @param awardId the award id
     * @param submissionTimestamp an RFC 3339 date-time, used verbatim in the key
     * @param payload the payload bytes
     * @param amountCents the amount, greater than 0
     * @return the {@link Decision}, as {@link #submit(Submission)}
     * @throws GateException the sidecar's refusal or the call's failure: {@link GateException#isPoison()}
     *     dead-letter, {@link GateException#isRetryable()} do not acknowledge (redelivered), neither
     *     a deployment problem
     */
    public Decision submit(String awardId, String submissionTimestamp, byte[] payload, long amountCents)
            throws GateException {
        return submit(Submission.of(awardId, submissionTimestamp, payload, amountCents));
    }

    /**
     * Decides many deliveries: one result per item, in order. An item's error
     * is returned in its {@link BatchResult} (an item this client's validation
     * refused never leaves it); a failure of the whole call is thrown.
     *
     * @param submissions the deliveries; two with one key: the first CLAIMED, the rest DUPLICATE
     * @return one {@link BatchResult} per submission, in order
     * @throws GateException the whole call failed (no item's outcome is known: do not acknowledge any)
     */
    public List<BatchResult> submitBatch(List<Submission> submissions) throws GateException {
        List<BatchResult> results = new ArrayList<>(submissions.size());
        List<Integer> sent = new ArrayList<>(submissions.size());
        GateOuterClass.SubmitBatchRequest.Builder request = GateOuterClass.SubmitBatchRequest.newBuilder();
        for (Submission s : submissions) {
            GateException refused = validate ? refusal(s) : null;
            results.add(refused == null ? null : new BatchResult(null, refused));
            if (refused == null) {
                sent.add(results.size() - 1);
                request.addSubmissions(Convert.submission(s));
            }
        }
        if (!sent.isEmpty()) {
            GateOuterClass.SubmitBatchResponse response = call(GateGrpc.getSubmitBatchMethod(), request.build(), null);
            if (response.getResultsCount() != sent.size()) {
                throw GateErrors.forStatus(io.grpc.Status.Code.INTERNAL, "sidecar answered "
                        + response.getResultsCount() + " results for " + sent.size() + " submissions");
            }
            for (int i = 0; i < sent.size(); i++) {
                results.set(sent.get(i), Convert.batchResult(response.getResults(i)));
            }
        }
        return results;
    }

    private GateException refusal(Submission s) {
        try {
            Validation.checkSubmission(s, maxPayloadBytes);
            return null;
        } catch (GateException e) {
            return e;
        }
    }

    /**
     * The stored result for a key: {@code Gate.Lookup}, read-only.
     *
     * @param idempotencyKey the key (derived, or a producer's)
     * @return the stored {@link Decision} (outcome DUPLICATE), or empty when the key was never claimed
     * @throws GateException the call failed, or the key is malformed ({@link InvalidSubmissionException})
     */
    public Optional<Decision> lookup(String idempotencyKey) throws GateException {
        if (validate) {
            Validation.checkProducerKey(idempotencyKey);
        }
        GateOuterClass.LookupResponse r = call(GateGrpc.getLookupMethod(),
                GateOuterClass.LookupRequest.newBuilder().setIdempotencyKey(idempotencyKey).build(), null);
        return r.getFound() ? Optional.of(Convert.decision(r.getDecision())) : Optional.empty();
    }

    // -- Effects (DESIGN §9) ---------------------------------------------------

    /**
     * {@code Effects.Begin}: the lease ({@link Begun.Acquired}) or the stored
     * response ({@link Begun.Completed}). Waits, up to the deadline, for a
     * lease held elsewhere.
     *
     * @param namespace the effect's namespace (1-64 of [a-z0-9._-])
     * @param idempotencyKey the effect's key
     * @param request the request bytes (at most 1 MiB); the same key with another request is refused
     * @param leaseTtl how long the lease holds, or null for the sidecar's default (30 s)
     * @return {@link Begun.Acquired} (perform the effect, then complete or release) or
     *     {@link Begun.Completed} (done before: its stored response)
     * @throws GateException the call failed; {@link KeyReusedException} for another request under the key
     */
    public Begun begin(String namespace, String idempotencyKey, byte[] request, Duration leaseTtl)
            throws GateException {
        if (validate) {
            Validation.checkBegin(namespace, idempotencyKey, request, leaseTtl);
        }
        EffectsOuterClass.BeginRequest.Builder b = EffectsOuterClass.BeginRequest.newBuilder()
                .setNamespace(namespace).setIdempotencyKey(idempotencyKey).setRequest(ByteString.copyFrom(request));
        if (leaseTtl != null) {
            b.setLeaseTtl(com.google.protobuf.Duration.newBuilder()
                    .setSeconds(leaseTtl.getSeconds()).setNanos(leaseTtl.getNano()));
        }
        return Convert.begun(effectCall(EffectsGrpc.getBeginMethod(), b.build()));
    }

    /**
     * {@code Effects.Complete}: commits the effect's response.
     *
     * @param namespace the effect's namespace
     * @param idempotencyKey the effect's key
     * @param leaseToken the token {@link #begin} gave
     * @param response the provider's response (at most 1 MiB)
     * @return completed_at, RFC 3339 UTC
     * @throws GateException the call failed; {@link LeaseLostException} when the lease was taken over
     */
    public String complete(String namespace, String idempotencyKey, String leaseToken, byte[] response)
            throws GateException {
        if (validate) {
            Validation.checkComplete(namespace, idempotencyKey, leaseToken, response);
        }
        return effectCall(EffectsGrpc.getCompleteMethod(), EffectsOuterClass.CompleteRequest.newBuilder()
                .setNamespace(namespace).setIdempotencyKey(idempotencyKey).setLeaseToken(leaseToken)
                .setResponse(ByteString.copyFrom(response)).build()).getCompletedAt();
    }

    /**
     * {@code Effects.Release}: the effect certainly did not happen; the next Begin acquires at once.
     *
     * @param namespace the effect's namespace
     * @param idempotencyKey the effect's key
     * @param leaseToken the token {@link #begin} gave
     * @param reason why (at most 256 characters), recorded
     * @throws GateException the call failed; {@link LeaseLostException} when the lease was taken over
     */
    public void release(String namespace, String idempotencyKey, String leaseToken, String reason)
            throws GateException {
        if (validate) {
            Validation.checkRelease(namespace, idempotencyKey, leaseToken, reason);
        }
        effectCall(EffectsGrpc.getReleaseMethod(), EffectsOuterClass.ReleaseRequest.newBuilder()
                .setNamespace(namespace).setIdempotencyKey(idempotencyKey).setLeaseToken(leaseToken)
                .setReason(reason).build());
    }

    /** The effect a {@link #perform} block runs while holding the lease. */
    @FunctionalInterface
    public interface EffectBody {
        /**
         * Performs the effect, passing the key to the provider.
         *
         * @param lease the lease held ({@code attempt > 1}: an earlier attempt may have reached
         *     the provider; ask it first)
         * @return the provider's response, stored as the effect's result
         * @throws Exception the effect certainly did not happen (the lease is released)
         */
        byte[] perform(Begun.Acquired lease) throws Exception;
    }

    /**
     * An effect performed at most once: Begin; when completed before, its
     * stored response; when acquired, runs {@code body} and completes with its
     * result. An exception from {@code body} releases the lease (the effect is
     * taken not to have happened) and is rethrown; a crash leaves the lease
     * to expire.
     *
     * @param namespace the effect's namespace
     * @param idempotencyKey the effect's key
     * @param request the request bytes (at most 1 MiB)
     * @param leaseTtl how long the lease holds, or null for the sidecar's default (30 s)
     * @param body the effect, run only when this call acquired the lease
     * @return the effect's response: {@code body}'s, or the one stored by an earlier attempt
     * @throws Exception {@code body}'s exception (after the release), or a {@link GateException}
     */
    public byte[] perform(String namespace, String idempotencyKey, byte[] request, Duration leaseTtl, EffectBody body)
            throws Exception {
        Begun begun = begin(namespace, idempotencyKey, request, leaseTtl);
        if (begun instanceof Begun.Completed done) {
            return done.response();
        }
        Begun.Acquired lease = (Begun.Acquired) begun;
        byte[] response;
        try {
            response = body.perform(lease);
        } catch (Exception e) {
            release(namespace, idempotencyKey, lease.leaseToken(), Convert.reason(e));
            throw e;
        }
        Objects.requireNonNull(response, "the effect body returned no response");
        complete(namespace, idempotencyKey, lease.leaseToken(), response);
        return response;
    }

    // -- calls -------------------------------------------------------------------

    private <Q, R> R call(MethodDescriptor<Q, R> method, Q request, String traceparent) throws GateException {
        CallOptions options = CallOptions.DEFAULT.withDeadlineAfter(deadlineNanos, TimeUnit.NANOSECONDS);
        Channel ch = channel;
        if (traceparent != null && !traceparent.isEmpty()) {
            Metadata headers = new Metadata();
            headers.put(TRACEPARENT, traceparent);
            ch = io.grpc.ClientInterceptors.intercept(channel,
                    io.grpc.stub.MetadataUtils.newAttachHeadersInterceptor(headers));
        }
        try {
            return ClientCalls.blockingUnaryCall(ch, method, options, request);
        } catch (StatusRuntimeException e) {
            throw GateErrors.fromGrpc(e);
        }
    }

    private <Q, R> R effectCall(MethodDescriptor<Q, R> method, Q request) throws GateException {
        try {
            return call(method, request, null);
        } catch (GateException e) {
            throw GateErrors.effectError(e);
        }
    }

    /** Closes the channel this client opened (not one it was given). */
    @Override
    public void close() {
        if (ownedChannel != null) {
            ownedChannel.shutdown();
            try {
                if (!ownedChannel.awaitTermination(5, TimeUnit.SECONDS)) {
                    ownedChannel.shutdownNow();
                }
            } catch (InterruptedException e) {
                ownedChannel.shutdownNow();
                Thread.currentThread().interrupt();
            }
        }
    }

    /** Settings of a {@link GateClient}. */
    public static final class Builder {
        private String target = DEFAULT_TARGET;
        private Channel channel;
        private Duration deadline = DEFAULT_DEADLINE;
        private long maxPayloadBytes;
        private boolean validate = true;

        private Builder() {}

        /**
         * The sidecar's address.
         *
         * @param target {@code host:port}, {@code http://host:port} or {@code https://host:port}
         *     (default {@value GateClient#DEFAULT_TARGET})
         * @return this builder
         */
        public Builder target(String target) {
            this.target = Objects.requireNonNull(target);
            return this;
        }

        /**
         * A channel of the caller's (TLS, interceptors...) instead of the target; the client does not close it.
         *
         * @param channel the channel
         * @return this builder
         */
        public Builder channel(Channel channel) {
            this.channel = Objects.requireNonNull(channel);
            return this;
        }

        /**
         * The deadline of each call: an expired one is {@link RetryableException.DeadlineExceeded}.
         *
         * @param deadline positive (default 10 s)
         * @return this builder
         */
        public Builder deadline(Duration deadline) {
            if (deadline.isNegative() || deadline.isZero()) {
                throw new IllegalArgumentException("deadline must be positive, got " + deadline);
            }
            this.deadline = deadline;
            return this;
        }

        /**
         * The sidecar's {@code ONCEGATE_MAX_PAYLOAD_BYTES}, to refuse a larger
         * payload before sending.
         *
         * @param maxPayloadBytes the limit (0, the default: leave it to the sidecar)
         * @return this builder
         */
        public Builder maxPayloadBytes(long maxPayloadBytes) {
            this.maxPayloadBytes = maxPayloadBytes;
            return this;
        }

        /**
         * Whether to validate requests before sending (the sidecar validates either way).
         *
         * @param validate default true
         * @return this builder
         */
        public Builder validate(boolean validate) {
            this.validate = validate;
            return this;
        }

        /**
         * The client.
         *
         * @return a client with these settings; close it when done
         */
        public GateClient build() {
            return new GateClient(this);
        }
    }
}
