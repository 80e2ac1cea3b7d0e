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

    /** A client of the sidecar at {@code target} with the default settings. */
    public static GateClient connect(String target) {
        return builder().target(target).build();
    }

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

    /** Decides one delivery: CLAIMED or DUPLICATE; any error is thrown. */
    public Decision submit(Submission s) throws GateException {
        return submit(s, null);
    }

    /**
     * As {@link #submit(Submission)}, continuing the W3C trace
     * {@code traceparent} (the broker message's header, say): the sidecar's
     * span and the outbox event carry it on.
     */
    public Decision submit(Submission s, String traceparent) throws GateException {
        if (validate) {
            Validation.checkSubmission(s, maxPayloadBytes);
        }
        return Convert.decision(call(GateGrpc.getSubmitMethod(), Convert.submission(s), traceparent));
    }

    /** Decides one delivery whose key is derived. */
    public Decision submit(String awardId, String submissionTimestamp, byte[] payload, long amountCents)
            throws GateException {
        return submit(Submission.of(awardId, submissionTimestamp, payload, amountCents));
    }

    /**
     * Decides many deliveries: one result per item, in order. An item's error
     * is returned in its {@link BatchResult} (an item this client's validation
     * refused never leaves it); a failure of the whole call is thrown.
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

    /** The stored result for a key (outcome DUPLICATE), or empty when none. */
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
     * lease held elsewhere. {@code leaseTtl} null: the sidecar's default (30 s).
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

    /** {@code Effects.Complete}: commits the response; returns completed_at. */
    public String complete(String namespace, String idempotencyKey, String leaseToken, byte[] response)
            throws GateException {
        if (validate) {
            Validation.checkComplete(namespace, idempotencyKey, leaseToken, response);
        }
        return effectCall(EffectsGrpc.getCompleteMethod(), EffectsOuterClass.CompleteRequest.newBuilder()
                .setNamespace(namespace).setIdempotencyKey(idempotencyKey).setLeaseToken(leaseToken)
                .setResponse(ByteString.copyFrom(response)).build()).getCompletedAt();
    }

    /** {@code Effects.Release}: the effect certainly did not happen; the next Begin acquires at once. */
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
        /** Performs the effect (passing the key to the provider) and returns the provider's response. */
        byte[] perform(Begun.Acquired lease) throws Exception;
    }

    /**
     * An effect performed at most once: Begin; when completed before, its
     * stored response; when acquired, runs {@code body} and completes with its
     * result. An exception from {@code body} releases the lease (the effect is
     * taken not to have happened) and is rethrown; a crash leaves the lease
     * to expire.
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

        /** The sidecar's address (default {@value GateClient#DEFAULT_TARGET}). */
        public Builder target(String target) {
            this.target = Objects.requireNonNull(target);
            return this;
        }

        /** A channel of the caller's (TLS, interceptors...); the client does not close it. */
        public Builder channel(Channel channel) {
            this.channel = Objects.requireNonNull(channel);
            return this;
        }

        /** The deadline of each call (default 10 s). */
        public Builder deadline(Duration deadline) {
            if (deadline.isNegative() || deadline.isZero()) {
                throw new IllegalArgumentException("deadline must be positive, got " + deadline);
            }
            this.deadline = deadline;
            return this;
        }

        /**
         * The sidecar's {@code ONCEGATE_MAX_PAYLOAD_BYTES}, to refuse a larger
         * payload before sending (0, the default: leave it to the sidecar).
         */
        public Builder maxPayloadBytes(long maxPayloadBytes) {
            this.maxPayloadBytes = maxPayloadBytes;
            return this;
        }

        /** Whether to validate requests before sending (default true; the sidecar validates either way). */
        public Builder validate(boolean validate) {
            this.validate = validate;
            return this;
        }

        public GateClient build() {
            return new GateClient(this);
        }
    }
}
