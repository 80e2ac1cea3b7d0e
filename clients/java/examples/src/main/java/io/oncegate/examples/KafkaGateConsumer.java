package io.oncegate.examples;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.oncegate.client.Decision;
import io.oncegate.client.GateClient;
import io.oncegate.client.GateException;
import io.oncegate.client.Submission;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A Kafka consumer with exactly-once effect through the oncegate sidecar, on
 * plain {@code kafka-clients}: poll, {@code submit}, commit the offset only
 * after CLAIMED or DUPLICATE.
 *
 * <ul>
 * <li>{@code isolation.level=read_committed}, {@code enable.auto.commit=false}:
 *     an offset is committed only once its message is decided. Killed before
 *     the commit, the message is read again (here or by the member that takes
 *     the partition) and the sidecar answers DUPLICATE.</li>
 * <li>A message error (malformed body, {@code isPoison()}): produced to the
 *     dead-letter topic with its offset committed <em>in the same Kafka
 *     transaction</em>, so a read_committed reader sees each poison message
 *     once even when this process is killed midway.</li>
 * <li>Any other error: no commit; the partition is rewound to the message
 *     (seek) and paused for a backoff; the other partitions go on.</li>
 * <li>Each handled message is printed to stdout as one JSON line <em>before</em>
 *     its offset is committed; logs go to stderr; payloads are never printed.</li>
 * <li>SIGTERM/SIGINT: finish the message in hand, commit, leave the group, exit 0.</li>
 * </ul>
 *
 * <p>Messages: a JSON object {@code award_id}, {@code submission_timestamp},
 * {@code amount_cents}, {@code payload} (base64), optional {@code idempotency_key}
 * (the body of the Python examples).
 */
public final class KafkaGateConsumer {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final GateClient gate;
    private final Options o;
    private final KafkaConsumer<byte[], byte[]> consumer;
    private final KafkaProducer<byte[], byte[]> deadLetters;
    private final Map<TopicPartition, Long> pausedUntil = new HashMap<>();
    private final Map<TopicPartition, Integer> failures = new HashMap<>();
    /** Next offset to commit: decided, not yet committed. */
    private final Map<TopicPartition, Long> decided = new HashMap<>();
    private int sinceCommit;
    private volatile boolean stopping;

    KafkaGateConsumer(GateClient gate, Options o) {
        this.gate = gate;
        this.o = o;
        Properties c = new Properties();
        c.put("bootstrap.servers", o.bootstrap);
        c.put("client.id", o.consumerName);
        c.put("group.id", o.group);
        c.put("isolation.level", "read_committed");
        c.put("enable.auto.commit", "false");
        c.put("auto.offset.reset", "earliest");
        c.put("session.timeout.ms", String.valueOf(o.sessionTimeout.toMillis()));
        c.put("heartbeat.interval.ms", String.valueOf(Math.max(o.sessionTimeout.toMillis() / 4, 100)));
        c.put("max.poll.records", "100");
        consumer = new KafkaConsumer<>(c, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        // One transactional id per member name: a restarted member of the same
        // name fences its predecessor and aborts what that one left open.
        Properties p = new Properties();
        p.put("bootstrap.servers", o.bootstrap);
        p.put("client.id", o.consumerName + "-dead-letters");
        p.put("transactional.id", o.group + ".dead-letter." + o.consumerName);
        p.put("transaction.timeout.ms", "10000");
        deadLetters = new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
        deadLetters.initTransactions();
    }

    /** Asks the loop to stop after the message in hand (from a signal handler). */
    void stop() {
        if (!stopping) {
            log("stopping: finishing the message in hand");
        }
        stopping = true;
        consumer.wakeup();
    }

    int run() {
        consumer.subscribe(List.of(o.topic), new Rebalance());
        log("consuming topic=" + o.topic + " group=" + o.group);
        try {
            while (!stopping) {
                resumeDue();
                Iterable<ConsumerRecord<byte[], byte[]>> records;
                try {
                    records = consumer.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    continue;
                }
                Set<TopicPartition> rewound = new HashSet<>();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    if (stopping || rewound.contains(tp) || pausedUntil.containsKey(tp)) {
                        continue; // read again from its position
                    }
                    if (!handle(r, tp)) {
                        rewound.add(tp);
                    }
                    throttle();
                }
            }
            commitDecided(null);
        } finally {
            consumer.close(); // leaves the group: its partitions move at once
            deadLetters.close();
        }
        return 0;
    }

    /** Handles one message; false when its partition was rewound to it. */
    private boolean handle(ConsumerRecord<byte[], byte[]> r, TopicPartition tp) {
        Submission s;
        try {
            s = Messages.parse(r.value());
        } catch (Messages.Malformed e) {
            return deadLetter(r, tp, "MALFORMED", e.getMessage());
        }
        Decision d;
        try {
            d = gate.submit(s, header(r, "traceparent"));
        } catch (GateException e) {
            if (e.isPoison()) {
                return deadLetter(r, tp, e.code().name(), e.serverMessage());
            }
            backOff(r, tp, e);
            return false;
        }
        failures.remove(tp);
        // The line goes out before the commit: a committed offset is never read
        // again, so its line must already be printed (killed in between, the
        // message is read again and printed DUPLICATE).
        ObjectNode line = line(r, d.outcome().name());
        line.put("key", d.idempotencyKey());
        if (d.disbursement() != null) {
            line.put("disbursement_id", d.disbursement().id()).put("sequence", d.disbursement().sequence());
        }
        line.put("decided_by", d.decidedBy().name());
        emit(line);
        decided.put(tp, r.offset() + 1);
        if (++sinceCommit >= o.commitEvery) {
            commitDecided(null);
        }
        return true;
    }

    /** No commit: rewind the partition to the message and let it wait. */
    private void backOff(ConsumerRecord<byte[], byte[]> r, TopicPartition tp, GateException e) {
        int n = failures.merge(tp, 1, Integer::sum);
        long delayMs = (long) Math.min(50 * Math.pow(2, Math.min(n, 7)), 5000);
        consumer.pause(List.of(tp));
        consumer.seek(tp, r.offset());
        pausedUntil.put(tp, System.nanoTime() + delayMs * 1_000_000);
        log("submit failed, partition " + r.partition() + " waits " + delayMs + " ms at offset " + r.offset()
                + " code=" + e.code());
        ObjectNode line = line(r, "ERROR").put("code", e.code().name()).put("retryable", e.isRetryable());
        emit(line);
    }

    /** The message and its offset commit in one transaction; false (rewound) when that failed. */
    private boolean deadLetter(ConsumerRecord<byte[], byte[]> r, TopicPartition tp, String code, String reason) {
        ProducerRecord<byte[], byte[]> dead = new ProducerRecord<>(o.deadLetterTopic, null, r.key(), r.value(),
                r.headers());
        dead.headers().add("oncegate_error", code.getBytes(StandardCharsets.UTF_8))
                .add("oncegate_error_message", reason.getBytes(StandardCharsets.UTF_8))
                .add("oncegate_source", (r.topic() + "/" + r.partition() + "/" + r.offset())
                        .getBytes(StandardCharsets.UTF_8));
        boolean done;
        try {
            deadLetters.beginTransaction();
            deadLetters.send(dead);
            deadLetters.sendOffsetsToTransaction(Map.of(tp, new OffsetAndMetadata(r.offset() + 1)),
                    consumer.groupMetadata());
            deadLetters.commitTransaction();
            decided.remove(tp); // committed past them
            done = true;
        } catch (ProducerFencedException e) {
            // Another member of this name took over: this process must go.
            throw e;
        } catch (KafkaException e) {
            log("dead-letter transaction failed partition=" + r.partition() + " offset=" + r.offset() + ": " + e);
            try {
                deadLetters.abortTransaction();
            } catch (KafkaException ignored) {
                // the next beginTransaction reports a producer that cannot go on
            }
            consumer.seek(tp, r.offset()); // not decided: read it again
            done = false;
        }
        log("dead-lettered partition=" + r.partition() + " offset=" + r.offset() + " code=" + code + " reason=" + reason);
        emit(line(r, "DEAD_LETTER").put("code", code).put("message", reason).put("committed", done));
        return done;
    }

    /** Commits the decided offsets (of {@code only} partitions, or all). */
    private void commitDecided(Collection<TopicPartition> only) {
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (TopicPartition tp : new ArrayList<>(decided.keySet())) {
            if (only == null || only.contains(tp)) {
                offsets.put(tp, new OffsetAndMetadata(decided.remove(tp)));
            }
        }
        if (only == null) {
            sinceCommit = 0;
        }
        if (offsets.isEmpty()) {
            return;
        }
        try {
            consumer.commitSync(offsets);
            offsets.forEach((tp, off) -> log("committed partition=" + tp.partition() + " offset=" + off.offset()));
        } catch (WakeupException e) {
            consumer.commitSync(offsets); // the wake-up was for poll; commit anyway
        } catch (KafkaException e) {
            // The partition moved (rebalance) or the broker is gone: the new
            // owner reads those messages again and gets DUPLICATE.
            log("commit failed " + offsets + ": " + e);
        }
    }

    private void resumeDue() {
        long now = System.nanoTime();
        List<TopicPartition> due = new ArrayList<>();
        pausedUntil.forEach((tp, at) -> {
            if (at - now <= 0) {
                due.add(tp);
            }
        });
        if (!due.isEmpty()) {
            consumer.resume(due);
            due.forEach(pausedUntil::remove);
        }
    }

    private void throttle() {
        if (o.maxRate > 0) {
            try {
                Thread.sleep((long) (1000 / o.maxRate));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                stopping = true;
            }
        }
    }

    private final class Rebalance implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            log("assigned " + partitions.stream().map(TopicPartition::partition).sorted().toList());
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            // Commit what was decided on them; the next owner reads the rest.
            log("revoked " + partitions.stream().map(TopicPartition::partition).sorted().toList());
            commitDecided(partitions);
            forget(partitions);
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            log("lost " + partitions.stream().map(TopicPartition::partition).sorted().toList());
            partitions.forEach(decided::remove); // no longer ours to commit
            forget(partitions);
        }

        private void forget(Collection<TopicPartition> partitions) {
            partitions.forEach(pausedUntil::remove);
            partitions.forEach(failures::remove);
        }
    }

    private ObjectNode line(ConsumerRecord<byte[], byte[]> r, String outcome) {
        String id = header(r, "message_id");
        ObjectNode line = JSON.createObjectNode().put("consumer", o.consumerName).put("partition", r.partition())
                .put("offset", r.offset()).put("message_id", id != null ? id : header(r, "event_id"));
        return line.put("outcome", outcome);
    }

    private static String header(ConsumerRecord<byte[], byte[]> r, String name) {
        Header h = r.headers().lastHeader(name);
        return h == null || h.value() == null ? null : new String(h.value(), StandardCharsets.UTF_8);
    }

    private static synchronized void emit(JsonNode line) {
        System.out.println(line.toString());
        System.out.flush();
    }

    static void log(String message) {
        System.err.println(java.time.Instant.now() + " INFO oncegate.kafka " + message);
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        Options o = Options.parse(args);
        int code;
        try (GateClient gate = GateClient.builder().target(o.target).deadline(o.timeout).build()) {
            KafkaGateConsumer c = new KafkaGateConsumer(gate, o);
            Signals.onTermination(c::stop);
            code = c.run();
        }
        System.exit(code);
    }
}
