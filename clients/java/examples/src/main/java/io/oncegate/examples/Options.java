package io.oncegate.examples;

import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.time.Duration;

/** The consumer's command line (the Python example's flags). */
final class Options {
    String bootstrap = env("KAFKA_BOOTSTRAP", "127.0.0.1:9092");
    String topic;
    String group;
    String deadLetterTopic;
    String target = env("ONCEGATE_TARGET", "127.0.0.1:50051");
    String consumerName = defaultName();
    Duration timeout = Duration.ofSeconds(10);
    Duration sessionTimeout = Duration.ofSeconds(10);
    int commitEvery = 1;
    double maxRate;

    static final String USAGE = "usage: KafkaGateConsumer --topic T --group G [--bootstrap-servers H:P] "
            + "[--dead-letter-topic T.dead] [--target 127.0.0.1:50051] [--consumer NAME] [--timeout SECONDS] "
            + "[--session-timeout SECONDS] [--commit-every N] [--max-rate PER_SECOND]";

    static Options parse(String[] args) {
        Options o = new Options();
        for (int i = 0; i < args.length; i++) {
            String flag = args[i];
            if (flag.equals("-h") || flag.equals("--help")) {
                System.out.println(USAGE);
                System.exit(0);
            }
            if (i + 1 >= args.length) {
                fail(flag + " needs a value");
            }
            String v = args[++i];
            switch (flag) {
                case "--bootstrap-servers": o.bootstrap = v; break;
                case "--topic": o.topic = v; break;
                case "--group": o.group = v; break;
                case "--dead-letter-topic": o.deadLetterTopic = v; break;
                case "--target": o.target = v; break;
                case "--consumer": o.consumerName = v; break;
                case "--timeout": o.timeout = seconds(flag, v); break;
                case "--session-timeout": o.sessionTimeout = seconds(flag, v); break;
                case "--commit-every": o.commitEvery = positive(flag, v); break;
                case "--max-rate": o.maxRate = Double.parseDouble(v); break;
                default: fail("unknown flag " + flag);
            }
        }
        if (o.topic == null || o.group == null) {
            fail("--topic and --group are required");
        }
        if (o.deadLetterTopic == null) {
            o.deadLetterTopic = o.topic + ".dead";
        }
        return o;
    }

    private static Duration seconds(String flag, String v) {
        double s = Double.parseDouble(v);
        if (!(s > 0)) {
            fail(flag + " must be greater than 0, got " + v);
        }
        return Duration.ofNanos((long) (s * 1e9));
    }

    private static int positive(String flag, String v) {
        int n = Integer.parseInt(v);
        if (n < 1) {
            fail(flag + " must be at least 1, got " + v);
        }
        return n;
    }

    private static void fail(String message) {
        System.err.println("KafkaGateConsumer: " + message + "\n" + USAGE);
        System.exit(64);
    }

    private static String env(String name, String fallback) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? fallback : v;
    }

    private static String defaultName() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (java.io.IOException e) {
            host = "consumer";
        }
        return host + "-" + ManagementFactory.getRuntimeMXBean().getPid();
    }
}
