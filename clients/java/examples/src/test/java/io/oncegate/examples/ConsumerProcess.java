package io.oncegate.examples;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;

/** The example consumer in a JVM of its own, its stdout lines parsed and its stderr kept. */
final class ConsumerProcess {
    private static final ObjectMapper JSON = new ObjectMapper();

    final String name;
    final Process process;
    final List<JsonNode> lines = new CopyOnWriteArrayList<>();
    final List<String> log = new CopyOnWriteArrayList<>();

    ConsumerProcess(String name, List<String> args) throws IOException {
        this.name = name;
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath(), KafkaGateConsumer.class.getName(),
                "--consumer", name));
        cmd.addAll(args);
        process = new ProcessBuilder(cmd).start();
        Thread out = new Thread(() -> read(process.getInputStream(), true), name + "-out");
        Thread err = new Thread(() -> read(process.getErrorStream(), false), name + "-err");
        out.setDaemon(true);
        err.setDaemon(true);
        out.start();
        err.start();
    }

    private static String classpath() throws IOException {
        String deps = Files.readString(Path.of(System.getProperty("oncegate.classpath.file"))).trim();
        return System.getProperty("oncegate.classes") + java.io.File.pathSeparator + deps;
    }

    private void read(java.io.InputStream in, boolean json) {
        try (BufferedReader r = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8))) {
            for (String line; (line = r.readLine()) != null; ) {
                if (json) {
                    lines.add(JSON.readTree(line));
                } else {
                    log.add(line);
                }
            }
        } catch (IOException e) {
            log.add("(reader: " + e + ")");
        }
    }

    /** Decisions printed (CLAIMED, DUPLICATE, DEAD_LETTER). */
    long decisions() {
        return lines.stream().filter(l -> !l.get("outcome").asText().equals("ERROR")).count();
    }

    /**
     * Whether the last decision printed on some partition is past what this
     * process last said it committed there: a decided, uncommitted offset.
     */
    boolean holdsAnUncommittedDecision() {
        Map<Integer, Long> decided = new HashMap<>();
        for (JsonNode l : lines) {
            String outcome = l.get("outcome").asText();
            if (outcome.equals("CLAIMED") || outcome.equals("DUPLICATE")) {
                decided.put(l.get("partition").asInt(), l.get("offset").asLong() + 1);
            }
        }
        Map<Integer, Long> committed = new HashMap<>();
        for (String line : log) {
            int at = line.indexOf("committed partition=");
            if (at >= 0) {
                String[] kv = line.substring(at + "committed ".length()).split(" ");
                committed.put(Integer.parseInt(kv[0].split("=")[1]), Long.parseLong(kv[1].split("=")[1]));
            }
        }
        return decided.entrySet().stream().anyMatch(e -> e.getValue() > committed.getOrDefault(e.getKey(), 0L));
    }

    boolean alive() {
        return process.isAlive();
    }

    /** SIGKILL. */
    void kill() throws InterruptedException {
        process.destroyForcibly();
        process.waitFor(10, TimeUnit.SECONDS);
    }

    /** SIGTERM; the exit code. */
    int terminate() throws InterruptedException {
        process.destroy();
        if (!process.waitFor(60, TimeUnit.SECONDS)) {
            process.destroyForcibly().waitFor();
            return -1;
        }
        return process.exitValue();
    }

    String logTail() {
        List<String> l = new ArrayList<>(log);
        return "--- " + name + "\n" + String.join("\n", l.subList(Math.max(0, l.size() - 30), l.size()));
    }
}
