package io.oncegate.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import io.oncegate.client.testing.Sidecar;
import io.oncegate.client.testing.Vectors;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import oncegate.v1.EffectsGrpc;
import oncegate.v1.EffectsOuterClass;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The shared vectors against the real sidecar through this client, with its
 * own validation off (so each request reaches the sidecar): every rejection is
 * the exception of the table with the vector's code and exact message, and
 * nothing is written; every key vector is CLAIMED with its key, then
 * DUPLICATE with the same stored result.
 */
class ServerVectorsTest {
    @TempDir
    static Path dir;
    static Sidecar sidecar;
    static GateClient unchecked;

    @BeforeAll
    static void start() throws Exception {
        sidecar = Sidecar.start(dir.resolve("sidecar"));
        unchecked = GateClient.builder().target(sidecar.target).deadline(Duration.ofSeconds(60)).validate(false)
                .build();
    }

    @AfterAll
    static void stop() throws Exception {
        if (unchecked != null) {
            unchecked.close();
        }
        if (sidecar != null) {
            sidecar.stop();
        }
    }

    @Test
    void everyRejectionVectorIsTheSidecarsAnswerAndWritesNothing() throws Exception {
        List<JsonNode> all = Vectors.rejections();
        for (JsonNode r : all) {
            String name = r.get("rpc").asText() + ": " + r.get("name").asText();
            GateException e = sidecarAnswer(r);
            if (e == null) {
                fail(name + ": accepted by the sidecar");
            }
            assertEquals(r.get("code").asText(), e.code().name(), name);
            assertEquals(r.get("message").asText(), e.serverMessage(), name);
            if (e.code() == io.grpc.Status.Code.INVALID_ARGUMENT) {
                assertTrue(e instanceof InvalidSubmissionException && e.isPoison() && !e.isRetryable(), name);
            }
            if (r.get("rpc").asText().equals("Submit")) {
                Submission s = Vectors.submission(r.get("request"));
                if (s.idempotencyKey() == null) {
                    assertTrue(unchecked.lookup(s.key()).isEmpty(), name + ": written");
                }
            }
        }
        System.out.println("java parity: " + all.size() + "/" + all.size()
                + " rejection vectors answered by the sidecar as written, through the client's error table");
    }

    private static GateException sidecarAnswer(JsonNode r) throws Exception {
        JsonNode v = r.get("request");
        try {
            switch (r.get("rpc").asText()) {
                case "Submit":
                    unchecked.submit(Vectors.submission(v));
                    break;
                case "SubmitBatch":
                    unchecked.submitBatch(Collections.nCopies(v.get("count").asInt(),
                            Vectors.submission(v.get("submission"))));
                    break;
                case "Lookup":
                    unchecked.lookup(v.get("idempotency_key").asText());
                    break;
                case "Begin":
                    rawBegin(v);
                    break;
                case "Complete":
                    unchecked.complete(v.get("namespace").asText(), v.get("idempotency_key").asText(),
                            v.get("lease_token").asText(), Vectors.body(v, "response"));
                    break;
                case "Release":
                    unchecked.release(v.get("namespace").asText(), v.get("idempotency_key").asText(),
                            v.get("lease_token").asText(), v.get("reason").asText());
                    break;
                default:
                    fail("unknown rpc " + r.get("rpc"));
            }
            return null;
        } catch (GateException e) {
            return e;
        }
    }

    /** Begin with the lease TTL exactly as the vector has it (a java.time.Duration normalises nanos). */
    private static void rawBegin(JsonNode v) throws GateException {
        EffectsOuterClass.BeginRequest.Builder b = EffectsOuterClass.BeginRequest.newBuilder()
                .setNamespace(v.get("namespace").asText()).setIdempotencyKey(v.get("idempotency_key").asText())
                .setRequest(com.google.protobuf.ByteString.copyFrom(Vectors.body(v, "request")));
        JsonNode ttl = v.get("lease_ttl");
        if (ttl != null) {
            b.setLeaseTtl(com.google.protobuf.Duration.newBuilder()
                    .setSeconds(Long.parseLong(ttl.get("seconds").asText())).setNanos(ttl.get("nanos").asInt()));
        }
        io.grpc.ManagedChannel channel = GateClient.open(sidecar.target);
        try {
            EffectsGrpc.newBlockingStub(channel).withDeadlineAfter(60, java.util.concurrent.TimeUnit.SECONDS)
                    .begin(b.build());
        } catch (io.grpc.StatusRuntimeException e) {
            throw GateErrors.effectError(GateErrors.fromGrpc(e));
        } finally {
            channel.shutdownNow();
        }
    }

    @Test
    void everyKeyVectorIsClaimedWithItsKeyThenDuplicate() throws Exception {
        try (Sidecar own = Sidecar.start(dir.resolve("keys"));
                GateClient gate = GateClient.builder().target(own.target).deadline(Duration.ofSeconds(60)).build()) {
            List<String> keys = new ArrayList<>();
            for (JsonNode v : Vectors.keys()) {
                String name = v.get("name").asText();
                Submission s = Vectors.submission(v);
                Decision first = gate.submit(s);
                assertTrue(first.isClaimed(), name);
                assertEquals(v.get("key").asText(), first.idempotencyKey(), name);
                assertEquals(s.awardId(), first.disbursement().awardId(), name);
                assertEquals(s.amountCents(), first.disbursement().amountCents(), name);
                Decision again = gate.submit(s);
                assertTrue(again.isDuplicate(), name);
                assertEquals(first.disbursement(), again.disbursement(), name);
                keys.add(first.idempotencyKey());
            }
            assertEquals(keys.size(), keys.stream().distinct().count());
            assertFalse(keys.isEmpty());
        }
    }

    @Test
    void theClientsOwnValidationRefusesWithTheSameCodeAndMessage() throws Exception {
        // The same vectors, validation on: refused before sending, as the sidecar would.
        int checked = 0;
        for (JsonNode r : Vectors.rejections()) {
            GateException local;
            try {
                local = VectorsTest.localAnswer(r);
            } catch (UnsupportedOperationException sidecars) {
                continue;
            }
            GateException remote = sidecarAnswer(r);
            String name = r.get("rpc").asText() + ": " + r.get("name").asText();
            assertEquals(remote.getClass(), local.getClass(), name);
            assertEquals(remote.serverMessage(), local.serverMessage(), name);
            checked++;
        }
        assertTrue(checked > 100, checked + " checked");
        byte[] big = new byte[Validation.MAX_EFFECT_BYTES + 1];
        try (GateClient gate = GateClient.connect("127.0.0.1:" + Sidecar.freePort())) {
            // Refused locally: no sidecar listens there.
            GateException e = org.junit.jupiter.api.Assertions.assertThrows(TooLargeException.class,
                    () -> gate.begin("payments", "k-1", big, null));
            assertArrayEquals(new Object[] {true, false}, new Object[] {e.isPoison(), e.isRetryable()});
        }
    }
}
