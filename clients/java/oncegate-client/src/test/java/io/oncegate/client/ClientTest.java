package io.oncegate.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.oncegate.client.testing.Sidecar;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The client against a real sidecar: every outcome of the contract. */
class ClientTest {
    private static final String TS = "2026-11-29T10:57:45Z";

    @TempDir
    static Path dir;
    static Sidecar sidecar;
    static GateClient gate;

    @BeforeAll
    static void start() throws Exception {
        sidecar = Sidecar.start(dir.resolve("sidecar"));
        gate = GateClient.builder().target(sidecar.target).deadline(Duration.ofSeconds(30)).build();
    }

    @AfterAll
    static void stop() throws Exception {
        if (gate != null) {
            gate.close();
        }
        if (sidecar != null) {
            assertEquals(0, sidecar.stop(), "the sidecar drains and exits 0");
        }
    }

    private static String award() {
        return "AWD-" + UUID.randomUUID();
    }

    @Test
    void claimedThenDuplicateWithTheStoredResult() throws Exception {
        Submission s = Submission.of(award(), TS, "{\"grant\":\"x\"}", 125_000);
        Decision first = gate.submit(s);
        assertTrue(first.isClaimed());
        assertEquals(s.key(), first.idempotencyKey());
        assertEquals(Decision.Tier.DATABASE, first.decidedBy());
        Disbursement d = first.disbursement();
        assertEquals(1, d.sequence());
        assertTrue(d.recordedAt().matches("\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{6}Z"), d.recordedAt());
        for (int i = 0; i < 3; i++) {
            Decision again = gate.submit(s, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
            assertTrue(again.isDuplicate());
            assertEquals(d, again.disbursement());
        }
        assertEquals(d, gate.lookup(s.key()).orElseThrow().disbursement());
    }

    @Test
    void sequenceIsPerAwardAndTheTimestampVerbatim() throws Exception {
        String award = award();
        long[] sequences = new long[3];
        String[] stamps = {"2026-11-29T10:57:45Z", "2026-11-29T10:57:45.000Z", "2026-11-29T11:57:45+01:00"};
        for (int i = 0; i < 3; i++) {
            sequences[i] = gate.submit(Submission.of(award, stamps[i], "p", 10)).disbursement().sequence();
        }
        assertArrayEquals(new long[] {1, 2, 3}, sequences);
    }

    @Test
    void batchDecidesEachItemInOrder() throws Exception {
        String award = award();
        Submission a = Submission.of(award, TS, "a", 1);
        Submission b = Submission.of(award, TS, "b", 2);
        Submission bad = Submission.of(award, "yesterday", "c", 3);
        Submission reused = Submission.of(award, TS, "d", 4).withIdempotencyKey(a.key());
        List<BatchResult> results = gate.submitBatch(List.of(a, b, a, bad, reused));
        assertEquals(5, results.size());
        assertTrue(results.get(0).decision().isClaimed());
        assertTrue(results.get(1).decision().isClaimed());
        assertTrue(results.get(2).decision().isDuplicate());
        assertEquals(results.get(0).decision().disbursement(), results.get(2).decision().disbursement());
        assertInstanceOf(InvalidSubmissionException.class, results.get(3).error());
        assertNull(results.get(3).decision());
        assertInstanceOf(KeyReusedException.class, results.get(4).error());
        // The same batch without local validation: the sidecar's per-item answers are the same.
        try (GateClient unchecked = GateClient.builder().target(sidecar.target).validate(false).build()) {
            List<BatchResult> again = unchecked.submitBatch(List.of(a, bad));
            assertTrue(again.get(0).decision().isDuplicate());
            assertEquals(results.get(3).error().serverMessage(), again.get(1).error().serverMessage());
        }
    }

    @Test
    void lookupOfAnUnknownKeyIsEmpty() throws Exception {
        assertTrue(gate.lookup("f".repeat(64)).isEmpty());
        assertThrows(InvalidSubmissionException.class, () -> gate.lookup("not/a/key"));
    }

    @Test
    void anEffectIsPerformedOnceAndAFailedAttemptIsReleased() throws Exception {
        String key = "pay-" + UUID.randomUUID();
        byte[] instruction = "pay 100 to grantee 7".getBytes(StandardCharsets.UTF_8);
        AtomicInteger performed = new AtomicInteger();
        IOException refused = assertThrows(IOException.class, () -> gate.perform("payments", key, instruction, null,
                lease -> {
                    performed.incrementAndGet();
                    throw new IOException("bank said no\n(timeout)");
                }));
        assertEquals("bank said no\n(timeout)", refused.getMessage());
        byte[] receipt = gate.perform("payments", key, instruction, null, lease -> {
            performed.incrementAndGet();
            assertEquals(2, lease.attempt(), "released: taken again as attempt 2");
            return "receipt-1".getBytes(StandardCharsets.UTF_8);
        });
        byte[] stored = gate.perform("payments", key, instruction, null, lease -> {
            throw new AssertionError("performed twice");
        });
        assertArrayEquals(receipt, stored);
        assertEquals(2, performed.get());
        Begun begun = gate.begin("payments", key, instruction, null);
        Begun.Completed done = assertInstanceOf(Begun.Completed.class, begun);
        assertEquals(2, done.attempt());
        assertNotEquals("", done.completedAt());
    }
}
