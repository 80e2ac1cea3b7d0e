package io.oncegate.client.testing;

import io.oncegate.client.GateClient;
import io.oncegate.client.GateException;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Assumptions;

/**
 * A real {@code oncegate serve} on free loopback ports with its own embedded
 * SQLite store, as the tests of every client start it. The binary:
 * {@code ONCEGATE_BIN}, default {@code <repo>/target/debug/oncegate}.
 */
public final class Sidecar implements AutoCloseable {
    public final String target;
    public final String metricsAddr;
    public final Path workdir;
    public final Path sqlitePath;
    private final Process process;
    private final Path log;

    private Sidecar(Process process, String target, String metricsAddr, Path workdir) {
        this.process = process;
        this.target = target;
        this.metricsAddr = metricsAddr;
        this.workdir = workdir;
        this.sqlitePath = workdir.resolve("oncegate.db");
        this.log = workdir.resolve("oncegate.log");
    }

    public static Path repo() {
        return Path.of(System.getProperty("oncegate.repo", "../../..")).toAbsolutePath().normalize();
    }

    /** The sidecar binary; the test is skipped when it was not built. */
    public static Path binary() {
        String env = System.getenv("ONCEGATE_BIN");
        Path bin = env != null && !env.isEmpty() ? Path.of(env) : repo().resolve("target/debug/oncegate");
        Assumptions.assumeTrue(Files.isExecutable(bin), "no oncegate binary at " + bin + " (cargo build)");
        return bin;
    }

    /**
     * A free loopback port below the kernel's ephemeral range (as the Rust
     * tests draw them): a port bind(0) handed out can be taken again by an
     * outgoing connection before the sidecar binds it.
     */
    public static int freePort() {
        java.util.Random rng = new java.util.Random();
        while (true) {
            int port = 20_000 + rng.nextInt(12_000);
            try (ServerSocket s = new ServerSocket(port, 1, java.net.InetAddress.getLoopbackAddress())) {
                return port;
            } catch (IOException taken) {
                // try another
            }
        }
    }

    public static Sidecar start(Path workdir) throws Exception {
        return start(workdir, Map.of());
    }

    /** Starts it and waits (up to 60 s) until it answers a Lookup. */
    public static Sidecar start(Path workdir, Map<String, String> env) throws Exception {
        Files.createDirectories(workdir);
        String target = "127.0.0.1:" + freePort();
        String metrics = "127.0.0.1:" + freePort();
        ProcessBuilder pb = new ProcessBuilder(List.of(binary().toString(), "serve")).directory(workdir.toFile());
        // A test sidecar gets exactly the configuration given here.
        pb.environment().keySet().removeIf(k -> k.startsWith("ONCEGATE_") || k.equals("DATABASE_URL")
                || k.equals("REDIS_URL"));
        pb.environment().putAll(Map.of("ONCEGATE_LISTEN", target, "ONCEGATE_METRICS_LISTEN", metrics,
                "ONCEGATE_SQLITE_PATH", workdir.resolve("oncegate.db").toString(),
                "ONCEGATE_INSTANCE_ID", "java-test-" + ProcessHandle.current().pid(), "RUST_LOG", "info"));
        pb.environment().putAll(env);
        pb.redirectErrorStream(true).redirectOutput(workdir.resolve("oncegate.log").toFile());
        Sidecar sidecar = new Sidecar(pb.start(), target, metrics, workdir);
        sidecar.awaitReady(Duration.ofSeconds(60));
        return sidecar;
    }

    private void awaitReady(Duration within) throws Exception {
        long end = System.nanoTime() + within.toNanos();
        String last = "no answer";
        try (GateClient gate = GateClient.builder().target(target).deadline(Duration.ofSeconds(1)).build()) {
            while (System.nanoTime() < end) {
                if (!process.isAlive()) {
                    throw new IllegalStateException("oncegate serve exited with " + process.exitValue()
                            + " before serving; log:\n" + logTail());
                }
                try {
                    gate.lookup("0".repeat(64));
                    return;
                } catch (GateException e) {
                    last = e.getMessage();
                }
                Thread.sleep(100);
            }
        }
        close();
        throw new IllegalStateException("oncegate serve not serving within " + within + " (" + last + "); log:\n"
                + logTail());
    }

    public String logTail() {
        try {
            List<String> lines = Files.readAllLines(log);
            return String.join("\n", lines.subList(Math.max(0, lines.size() - 40), lines.size()));
        } catch (IOException e) {
            return "(no log)";
        }
    }

    /** The metrics endpoint's text. */
    public String metrics() throws IOException, InterruptedException {
        var client = java.net.http.HttpClient.newHttpClient();
        var request = java.net.http.HttpRequest.newBuilder(java.net.URI.create("http://" + metricsAddr + "/metrics"))
                .build();
        return client.send(request, java.net.http.HttpResponse.BodyHandlers.ofString()).body();
    }

    /** SIGTERM, then the drain; SIGKILL after 25 s. Returns the exit code. */
    public int stop() throws InterruptedException {
        if (process.isAlive()) {
            process.destroy();
            if (!process.waitFor(25, TimeUnit.SECONDS)) {
                process.destroyForcibly().waitFor();
            }
        }
        return process.exitValue();
    }

    @Override
    public void close() throws InterruptedException {
        stop();
    }
}
