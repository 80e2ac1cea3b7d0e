package io.oncegate.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.oncegate.client.Decision;
import io.oncegate.client.GateClient;
import io.oncegate.client.Submission;
import io.oncegate.client.testing.Sidecar;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.UUID;
import java.util.function.BooleanSupplier;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The example consumer against the suite's Kafka and a real sidecar: a group of
 * two JVMs on a 3-partition topic written by a transactional producer (unique
 * submissions, producer duplicates, poison, and an aborted transaction that
 * read_committed consumers must never see). One member is SIGKILLed twice,
 * each time once it has made decisions and holds one it has not committed
 * yet. Afterwards: every valid message took effect once (each key found with
 * its amount, exactly as many claims as unique submissions, the store
 * reconciles), nothing of the aborted transaction did, and a read_committed
 * reader of the dead-letter topic finds exactly the poison messages, once
 * each, with their error codes.
 */
class KafkaConsumerKillTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final int UNIQUE = 600;
    private static final int REPEATS = 100;

    @TempDir
    Path dir;

    static String bootstrap() {
        for (String name : new String[] {"ONCEGATE_TEST_KAFKA_BOOTSTRAP", "KAFKA_BOOTSTRAP"}) {
            String v = System.getenv(name);
            if (v != null && !v.isEmpty()) {
                return v;
            }
        }
        return "127.0.0.1:9092";
    }

    record Message(String id, String kind, byte[] key, byte[] body, String expect) {}

    @Test
    void twoMembersKilledMidStreamGiveAnExactLedgerAndDeadLetters() throws Exception {
        long seed = new Random().nextLong();
        System.out.println("java kafka test seed " + seed);
        Random rng = new Random(seed);
        String unique = UUID.randomUUID().toString().substring(0, 12);
        String topic = "oncegate-java-test." + unique;
        String dlt = topic + ".dead";
        String boot = bootstrap();
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", boot))) {
            admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1), new NewTopic(dlt, 1, (short) 1)))
                    .all().get(60, java.util.concurrent.TimeUnit.SECONDS);
        }
        List<String> awards = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            awards.add("AWD-" + unique + "-" + i);
        }
        List<Submission> subs = new ArrayList<>();
        for (int i = 0; i < UNIQUE; i++) {
            Submission s = randomSubmission(rng, awards.get(rng.nextInt(awards.size())));
            subs.add(i % 10 == 0 ? s.withIdempotencyKey(UUID.randomUUID().toString()) : s);
        }
        List<Message> messages = messages(rng, subs, awards);
        List<Submission> aborted = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            aborted.add(randomSubmission(rng, awards.get(3)));
        }
        produce(boot, topic, messages, true);
        List<Message> abortedMessages = new ArrayList<>();
        for (int i = 0; i < aborted.size(); i++) {
            abortedMessages.add(new Message("aborted" + i, "aborted", "a".getBytes(), body(aborted.get(i)), null));
        }
        produce(boot, topic, abortedMessages, false);

        Sidecar sidecar = Sidecar.start(dir.resolve("sidecar"));
        List<ConsumerProcess> procs = new ArrayList<>();
        try {
            List<String> common = List.of("--bootstrap-servers", boot, "--topic", topic, "--group",
                    "java-test-" + unique, "--dead-letter-topic", dlt, "--target", sidecar.target,
                    "--session-timeout", "6", "--max-rate", "30", "--commit-every", "20");
            ConsumerProcess[] slots = {start(procs, "kc-" + unique + "-a", common), start(procs, "kc-" + unique + "-b", common)};
            List<Long> killedAfter = new ArrayList<>();
            for (int round = 0; round < 2; round++) {
                ConsumerProcess victim = slots[0];
                long before = victim.decisions();
                // The state to kill in: decisions made, one of them not committed yet.
                waitFor(() -> victim.decisions() >= before + 50 && victim.holdsAnUncommittedDecision(),
                        Duration.ofSeconds(120), "decisions before kill " + (round + 1), procs);
                victim.kill();
                killedAfter.add(victim.decisions());
                slots[0] = start(procs, victim.name, common); // same name: fences its dead-letter transactions
            }
            waitForEveryKey(sidecar, subs, procs);
            List<ConsumerRecord<byte[], byte[]>> dead = readAll(boot, dlt, 6);
            for (ConsumerProcess p : slots) {
                assertEquals(0, p.terminate(), p.name + " did not stop cleanly on SIGTERM\n" + p.logTail());
            }
            checkLedger(sidecar, subs, aborted);
            checkDeadLetters(dead, messages);
            checkLines(procs, messages, subs, killedAfter);
        } finally {
            for (ConsumerProcess p : procs) {
                p.kill();
            }
            sidecar.stop();
            try (Admin admin = Admin.create(Map.of("bootstrap.servers", boot))) {
                admin.deleteTopics(List.of(topic, dlt)).all().get(60, java.util.concurrent.TimeUnit.SECONDS);
            }
        }
        assertEquals(0, reconcile(sidecar), "oncegate reconcile: ledger, claims, totals and sequences agree");
    }

    private static ConsumerProcess start(List<ConsumerProcess> procs, String name, List<String> args)
            throws Exception {
        ConsumerProcess p = new ConsumerProcess(name, args);
        procs.add(p);
        return p;
    }

    static Submission randomSubmission(Random rng, String award) {
        String ts = String.format("%04d-%02d-%02dT%02d:%02d:%02d%s", 1970 + rng.nextInt(130), 1 + rng.nextInt(12),
                1 + rng.nextInt(28), rng.nextInt(24), rng.nextInt(60), rng.nextInt(60),
                List.of("Z", "+05:30", ".123456Z", "-08:00").get(rng.nextInt(4)));
        byte[] payload = new byte[rng.nextInt(1024)];
        rng.nextBytes(payload);
        return Submission.of(award, ts, payload, 1 + rng.nextInt(1_000_000_000));
    }

    static byte[] body(Submission s) {
        ObjectNode doc = JSON.createObjectNode().put("award_id", s.awardId())
                .put("submission_timestamp", s.submissionTimestamp()).put("amount_cents", s.amountCents())
                .put("payload", Base64.getEncoder().encodeToString(s.payload()));
        if (s.idempotencyKey() != null) {
            doc.put("idempotency_key", s.idempotencyKey());
        }
        return doc.toString().getBytes(StandardCharsets.UTF_8);
    }

    /** Valid (each unique once, plus repeats), and poison with the code each must be dead-lettered with. */
    private static List<Message> messages(Random rng, List<Submission> subs, List<String> awards) {
        List<Message> out = new ArrayList<>();
        for (Submission s : subs) {
            out.add(new Message(null, "valid", s.awardId().getBytes(StandardCharsets.UTF_8), body(s), s.key()));
        }
        for (int i = 0; i < REPEATS; i++) {
            Submission s = subs.get(rng.nextInt(subs.size()));
            out.add(new Message(null, "valid", s.awardId().getBytes(StandardCharsets.UTF_8), body(s), s.key()));
        }
        String ts = "2026-11-29T10:57:45Z";
        byte[][] invalid = {body(Submission.of(awards.get(0), "yesterday", "x", 100)),
            body(Submission.of(awards.get(1), ts, "zero", 0)),
            body(Submission.of(awards.get(2), "2026-02-30T10:00:00Z", "y", 5))};
        for (byte[] b : invalid) {
            out.add(new Message(null, "poison", "poison".getBytes(), b, "INVALID_ARGUMENT"));
        }
        byte[][] malformed = {"not json".getBytes(), "[1, 2]".getBytes(),
            ("{\"award_id\": \"" + awards.get(0) + "\", \"submission_timestamp\": \"" + ts
                    + "\", \"amount_cents\": 1.5}").getBytes(StandardCharsets.UTF_8)};
        for (byte[] b : malformed) {
            out.add(new Message(null, "poison", "poison".getBytes(), b, "MALFORMED"));
        }
        Collections.shuffle(out, rng);
        List<Message> named = new ArrayList<>();
        for (int i = 0; i < out.size(); i++) {
            Message m = out.get(i);
            named.add(new Message("m" + i, m.kind(), m.key(), m.body(), m.expect()));
        }
        return named;
    }

    private static void produce(String boot, String topic, List<Message> messages, boolean commit) {
        Properties p = new Properties();
        p.put("bootstrap.servers", boot);
        p.put("transactional.id", "java-test-" + UUID.randomUUID());
        try (KafkaProducer<byte[], byte[]> producer =
                new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            producer.initTransactions();
            producer.beginTransaction();
            for (Message m : messages) {
                ProducerRecord<byte[], byte[]> r = new ProducerRecord<>(topic, m.key(), m.body());
                r.headers().add("message_id", m.id().getBytes(StandardCharsets.UTF_8));
                producer.send(r);
            }
            producer.flush();
            if (commit) {
                producer.commitTransaction();
            } else {
                producer.abortTransaction();
            }
        }
    }

    private static void waitFor(BooleanSupplier cond, Duration within, String what, List<ConsumerProcess> procs)
            throws InterruptedException {
        long end = System.nanoTime() + within.toNanos();
        while (System.nanoTime() < end) {
            if (cond.getAsBoolean()) {
                return;
            }
            Thread.sleep(50);
        }
        fail("timed out waiting for " + what + "\n"
                + procs.stream().map(ConsumerProcess::logTail).collect(Collectors.joining("\n")));
    }

    /** Until every unique submission has a stored decision. */
    private static void waitForEveryKey(Sidecar sidecar, List<Submission> subs, List<ConsumerProcess> procs)
            throws Exception {
        Set<String> missing = subs.stream().map(Submission::key).collect(Collectors.toCollection(HashSet::new));
        try (GateClient gate = GateClient.builder().target(sidecar.target).deadline(Duration.ofSeconds(30)).build()) {
            waitFor(() -> {
                try {
                    for (String k : new ArrayList<>(missing)) {
                        if (gate.lookup(k).isPresent()) {
                            missing.remove(k);
                        }
                    }
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
                return missing.isEmpty();
            }, Duration.ofSeconds(180), "every unique submission decided (" + subs.size() + ")", procs);
        }
    }

    /** Every message of {@code topic}, read_committed: at least {@code expect}, then a quiet 1.5 s. */
    static List<ConsumerRecord<byte[], byte[]>> readAll(String boot, String topic, int expect) {
        Properties p = new Properties();
        p.put("bootstrap.servers", boot);
        p.put("group.id", "java-test-reader-" + UUID.randomUUID());
        p.put("isolation.level", "read_committed");
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        List<ConsumerRecord<byte[], byte[]>> found = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> c =
                new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            c.subscribe(List.of(topic));
            long end = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            long quietSince = 0;
            while (System.nanoTime() < end) {
                var records = c.poll(Duration.ofMillis(300));
                records.forEach(found::add);
                if (!records.isEmpty() || found.size() < expect) {
                    quietSince = 0;
                } else if (quietSince == 0) {
                    quietSince = System.nanoTime();
                } else if (System.nanoTime() - quietSince > 1_500_000_000L) {
                    break;
                }
            }
        }
        return found;
    }

    private static void checkLedger(Sidecar sidecar, List<Submission> subs, List<Submission> aborted)
            throws Exception {
        try (GateClient gate = GateClient.builder().target(sidecar.target).deadline(Duration.ofSeconds(30)).build()) {
            for (Submission s : subs) {
                Decision d = gate.lookup(s.key()).orElseThrow();
                assertEquals(s.awardId(), d.disbursement().awardId());
                assertEquals(s.amountCents(), d.disbursement().amountCents());
            }
            for (Submission s : aborted) {
                assertEquals(Optional.empty(), gate.lookup(s.key()), "a message of an aborted transaction took effect");
            }
        }
        double claimed = 0;
        for (String line : sidecar.metrics().split("\n")) {
            if (line.startsWith("oncegate_decisions_total{") && line.contains("outcome=\"CLAIMED\"")) {
                claimed += Double.parseDouble(line.substring(line.lastIndexOf(' ') + 1));
            }
        }
        assertEquals(subs.size(), (int) claimed, "claims made by the sidecar: one per unique submission");
    }

    private static void checkDeadLetters(List<ConsumerRecord<byte[], byte[]>> dead, List<Message> messages) {
        Map<String, Message> byId = messages.stream().collect(Collectors.toMap(Message::id, m -> m));
        List<String> got = new ArrayList<>();
        for (ConsumerRecord<byte[], byte[]> r : dead) {
            String id = new String(r.headers().lastHeader("message_id").value(), StandardCharsets.UTF_8);
            Message m = byId.get(id);
            assertEquals("poison", m.kind(), id);
            assertEquals(m.expect(), new String(r.headers().lastHeader("oncegate_error").value(), StandardCharsets.UTF_8));
            assertEquals(new String(m.body(), StandardCharsets.UTF_8), new String(r.value(), StandardCharsets.UTF_8));
            got.add(id);
        }
        List<String> poison = messages.stream().filter(m -> m.kind().equals("poison")).map(Message::id).sorted().toList();
        Collections.sort(got);
        assertEquals(poison, got, "the dead-letter topic: every poison message once");
    }

    private static void checkLines(List<ConsumerProcess> procs, List<Message> messages, List<Submission> subs,
            List<Long> killedAfter) {
        Map<String, Message> byId = messages.stream().collect(Collectors.toMap(Message::id, m -> m));
        List<JsonNode> lines = procs.stream().flatMap(p -> p.lines.stream()).toList();
        Map<String, Integer> claimed = new HashMap<>();
        Set<String> decided = new HashSet<>();
        Map<String, Integer> outcomes = new HashMap<>();
        Map<String, Integer> seen = new HashMap<>();
        for (JsonNode l : lines) {
            String outcome = l.get("outcome").asText();
            String id = l.get("message_id").asText();
            outcomes.merge(outcome, 1, Integer::sum);
            seen.merge(id, 1, Integer::sum);
            assertTrue(byId.containsKey(id), "a line for a message not produced (aborted?): " + l);
            Message m = byId.get(id);
            switch (outcome) {
                case "CLAIMED", "DUPLICATE" -> {
                    assertEquals("valid", m.kind(), l.toString());
                    assertEquals(m.expect(), l.get("key").asText(), l.toString());
                    decided.add(l.get("key").asText());
                    if (outcome.equals("CLAIMED")) {
                        claimed.merge(l.get("key").asText(), 1, Integer::sum);
                    }
                }
                case "DEAD_LETTER" -> {
                    assertEquals("poison", m.kind(), l.toString());
                    assertEquals(m.expect(), l.get("code").asText(), l.toString());
                }
                default -> fail("sidecar errors in a healthy run: " + l);
            }
        }
        assertTrue(claimed.values().stream().allMatch(n -> n == 1), "a key was CLAIMED twice");
        Set<String> keys = subs.stream().map(Submission::key).collect(Collectors.toSet());
        assertTrue(keys.containsAll(claimed.keySet()));
        assertEquals(keys, decided, "every submission decided by some consumer");
        long reread = seen.values().stream().filter(n -> n > 1).mapToLong(n -> n - 1).sum();
        long assignments = procs.stream().flatMap(p -> p.log.stream()).filter(s -> s.contains(" assigned ")).count();
        System.out.printf("java kafka: %d messages (%d unique, %d producer duplicates, 6 poison) + 20 aborted; "
                + "2 SIGKILLs (decisions printed by the victim before each: %s), %d assignments, "
                + "%d messages read again; outcomes %s; dead-letter topic 6%n",
                messages.size(), UNIQUE, REPEATS, killedAfter, assignments, reread, outcomes);
    }

    private static int reconcile(Sidecar sidecar) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(Sidecar.binary().toString(), "reconcile", "--sqlite-path",
                sidecar.sqlitePath.toString()).redirectErrorStream(true);
        pb.environment().keySet().removeIf(k -> k.startsWith("ONCEGATE_") || k.equals("DATABASE_URL"));
        Process p = pb.start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        int code = p.waitFor();
        if (code != 0) {
            System.out.println(out);
        }
        return code;
    }
}
