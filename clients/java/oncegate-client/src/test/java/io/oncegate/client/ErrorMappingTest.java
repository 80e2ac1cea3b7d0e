package io.oncegate.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import io.oncegate.client.testing.Sidecar;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.UUID;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The status table, and each mapping against the real sidecar (or a real dead or silent peer). */
class ErrorMappingTest {
    private static final String TS = "2026-11-29T10:57:45Z";

    @TempDir
    Path dir;

    /** The Python client's table: code, class, retryable, poison. */
    @Test
    void theTable() {
        Object[][] table = {
            {Status.Code.INVALID_ARGUMENT, InvalidSubmissionException.class, false, true},
            {Status.Code.FAILED_PRECONDITION, KeyReusedException.class, false, true},
            {Status.Code.UNAVAILABLE, RetryableException.Unavailable.class, true, false},
            {Status.Code.RESOURCE_EXHAUSTED, RetryableException.ResourceExhausted.class, true, false},
            {Status.Code.DEADLINE_EXCEEDED, RetryableException.DeadlineExceeded.class, true, false},
            {Status.Code.ABORTED, RetryableException.class, true, false},
            {Status.Code.INTERNAL, RetryableException.class, true, false},
            {Status.Code.UNKNOWN, RetryableException.class, true, false},
            {Status.Code.CANCELLED, RetryableException.class, true, false},
            {Status.Code.UNAUTHENTICATED, GateException.class, false, false},
            {Status.Code.PERMISSION_DENIED, GateException.class, false, false},
            {Status.Code.UNIMPLEMENTED, GateException.class, false, false},
        };
        for (Object[] row : table) {
            Status.Code code = (Status.Code) row[0];
            for (GateException e : new GateException[] {
                GateErrors.forStatus(code, "field award_id: bad"), GateErrors.forStatus(code.value(), "field award_id: bad")}) {
                assertSame(row[1], e.getClass(), code.name());
                assertEquals(row[2], e.isRetryable(), code.name());
                assertEquals(row[3], e.isPoison(), code.name());
                assertEquals(code, e.code());
                assertEquals("field award_id: bad", e.serverMessage());
            }
        }
        assertSame(LeaseLostException.class,
                GateErrors.forStatus(Status.Code.FAILED_PRECONDITION, "lease lost: the token ...").getClass());
        assertSame(RetryableException.class, GateErrors.forStatus(99, "?").getClass()); // unknown number: UNKNOWN
        GateException busy = GateErrors.forStatus(Status.Code.RESOURCE_EXHAUSTED, "more than 4096 requests in flight");
        assertSame(busy, GateErrors.effectError(busy));
        assertSame(TooLargeException.class, GateErrors.effectError(GateErrors.forStatus(
                Status.Code.RESOURCE_EXHAUSTED, "request is 1048577 bytes, the limit is 1048576 bytes")).getClass());
    }

    @Test
    void eachCodeFromTheRealSidecar() throws Exception {
        try (Sidecar sidecar = Sidecar.start(dir.resolve("sidecar"));
                GateClient gate = GateClient.builder().target(sidecar.target).deadline(Duration.ofSeconds(30))
                        .validate(false).build()) {
            String award = "AWD-" + UUID.randomUUID();
            InvalidSubmissionException invalid = assertThrows(InvalidSubmissionException.class,
                    () -> gate.submit(Submission.of(award, "yesterday", "x", 100)));
            assertTrue(invalid.serverMessage().startsWith("submission_timestamp"), invalid.getMessage());

            String key = UUID.randomUUID().toString();
            assertTrue(gate.submit(Submission.of(award, TS, "p", 100).withIdempotencyKey(key)).isClaimed());
            KeyReusedException reused = assertThrows(KeyReusedException.class,
                    () -> gate.submit(Submission.of(award, TS, "p", 101).withIdempotencyKey(key)));
            assertEquals("idempotency key reused with a different submission", reused.serverMessage());
            assertTrue(reused.isPoison());

            assertThrows(RetryableException.ResourceExhausted.class,
                    () -> gate.submit(Submission.of(award, TS, new byte[1024 * 1024 + 1], 100)));

            // A total that would overflow int64: refused, naming the award, nothing written.
            String big = "AWD-MAX-" + UUID.randomUUID();
            assertTrue(gate.submit(Submission.of(big, TS, "a", Long.MAX_VALUE)).isClaimed());
            InvalidSubmissionException overflow = assertThrows(InvalidSubmissionException.class,
                    () -> gate.submit(Submission.of(big, TS, "b", 1)));
            assertTrue(overflow.serverMessage().contains(big), overflow.serverMessage());
            assertTrue(gate.lookup(Submission.of(big, TS, "b", 1).key()).isEmpty());

            leaseLost(gate);
        }
    }

    private static void leaseLost(GateClient gate) throws Exception {
        String key = "k-" + UUID.randomUUID();
        byte[] req = "pay 100".getBytes(StandardCharsets.UTF_8);
        Begun.Acquired first = (Begun.Acquired) gate.begin("payments", key, req, Duration.ofMillis(200));
        // The lease expires; the next Begin takes it (attempt 2) and fences the first token.
        Begun.Acquired second;
        long end = System.nanoTime() + Duration.ofSeconds(20).toNanos();
        Begun again;
        do {
            again = gate.begin("payments", key, req, Duration.ofSeconds(30));
        } while (!(again instanceof Begun.Acquired) && System.nanoTime() < end);
        second = (Begun.Acquired) again;
        assertEquals(2, second.attempt());
        LeaseLostException lost = assertThrows(LeaseLostException.class,
                () -> gate.complete("payments", key, first.leaseToken(), "receipt".getBytes(StandardCharsets.UTF_8)));
        assertFalse(lost.isPoison() || lost.isRetryable());
        assertThrows(KeyReusedException.class,
                () -> gate.begin("payments", key, "pay 200".getBytes(StandardCharsets.UTF_8), null));
    }

    @Test
    void nothingListeningIsUnavailable() {
        try (GateClient gate = GateClient.builder().target("127.0.0.1:" + Sidecar.freePort())
                .deadline(Duration.ofSeconds(5)).build()) {
            GateException e = assertThrows(RetryableException.Unavailable.class,
                    () -> gate.submit(Submission.of("A", TS, "x", 1)));
            assertTrue(e.isRetryable() && !e.isPoison());
            assertTrue(e.getCause() instanceof io.grpc.StatusRuntimeException);
        }
    }

    @Test
    void aSilentPeerIsDeadlineExceeded() throws Exception {
        // Accepts TCP connections and never speaks HTTP/2: the call can only time out.
        try (ServerSocket blackHole = new ServerSocket(0, 16, java.net.InetAddress.getLoopbackAddress());
                GateClient gate = GateClient.builder().target("http://127.0.0.1:" + blackHole.getLocalPort() + "/")
                        .deadline(Duration.ofMillis(300)).build()) {
            assertThrows(RetryableException.DeadlineExceeded.class, () -> gate.submit(Submission.of("A", TS, "x", 1)));
        }
    }
    /** The sidecar always sends a Decision's disbursement: one without is an UNKNOWN error, never a null. */
    @Test
    void aDecisionWithoutItsDisbursementIsNotAnAnswer() throws GateException {
        oncegate.v1.GateOuterClass.Decision bare = oncegate.v1.GateOuterClass.Decision.newBuilder()
                .setOutcome(oncegate.v1.GateOuterClass.Outcome.CLAIMED).setIdempotencyKey("k")
                .setDecidedBy(oncegate.v1.GateOuterClass.Tier.DATABASE).build();
        GateException e = assertThrows(GateException.class, () -> Convert.decision(bare));
        assertEquals(Status.Code.UNKNOWN, e.code());
        assertTrue(e.serverMessage().contains("without its disbursement"), e.serverMessage());
        oncegate.v1.GateOuterClass.Decision whole = bare.toBuilder()
                .setDisbursement(oncegate.v1.GateOuterClass.Disbursement.newBuilder().setId("d").setSequence(1)).build();
        assertEquals("d", Convert.decision(whole).disbursement().id());
        BatchResult item = Convert.batchResult(oncegate.v1.GateOuterClass.Result.newBuilder().setDecision(bare).build());
        assertFalse(item.isDecided());
        assertEquals(Status.Code.UNKNOWN, item.error().code());
    }
}
