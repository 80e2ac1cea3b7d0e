package io.oncegate.examples;

import com.google.protobuf.ByteString;
import io.oncegate.client.GateClient;
import io.oncegate.client.Submission;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.concurrent.TimeUnit;
import oncegate.v1.GateGrpc;
import oncegate.v1.GateOuterClass;

/**
 * What the client costs per {@code Submit} over the bare generated stub, in
 * the same JVM, on the same channel, against a real sidecar: one submission
 * claimed once, then L1 duplicates (answered from the sidecar's memory, so
 * the sidecar is not what is measured). Sequential calls; after a warm-up,
 * rounds alternate stub and client, and the medians of the rounds are
 * reported: wall time per call and this process's CPU time per call.
 * A simple timed loop, not JMH: good to a microsecond or so, not to
 * nanoseconds.
 *
 * <pre>java -cp ... io.oncegate.examples.SubmitOverhead --target 127.0.0.1:50051 [--calls 2000] [--rounds 9]</pre>
 */
public final class SubmitOverhead {
    private SubmitOverhead() {}

    interface Call {
        void run() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        String target = "127.0.0.1:50051";
        int calls = 2000;
        int rounds = 9;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--target": target = args[i + 1]; break;
                case "--calls": calls = Integer.parseInt(args[i + 1]); break;
                case "--rounds": rounds = Integer.parseInt(args[i + 1]); break;
                default: throw new IllegalArgumentException("unknown flag " + args[i]);
            }
        }
        ManagedChannel channel = ManagedChannelBuilder.forTarget(target).usePlaintext().build();
        try (GateClient client = GateClient.builder().channel(channel).build()) {
            Submission s = Submission.of("AWD-BENCH-" + ProcessHandle.current().pid(), "2026-11-29T10:57:45Z",
                    "{\"grant\":\"overhead\",\"amount_cents\":125000}".getBytes(StandardCharsets.UTF_8), 125_000);
            GateOuterClass.Submission wire = GateOuterClass.Submission.newBuilder().setAwardId(s.awardId())
                    .setSubmissionTimestamp(s.submissionTimestamp()).setPayload(ByteString.copyFrom(s.payload()))
                    .setAmountCents(s.amountCents()).build();
            GateGrpc.GateBlockingStub stub = GateGrpc.newBlockingStub(channel);
            client.submit(s); // claimed once; every call below is an L1 duplicate
            // The bare stub as a consumer would call it: a deadline on each call.
            Call bare = () -> stub.withDeadlineAfter(10, TimeUnit.SECONDS).submit(wire);
            Call ours = () -> client.submit(s);
            for (int i = 0; i < 3; i++) { // warm-up: JIT, connection, L1
                measure(bare, calls);
                measure(ours, calls);
            }
            double[][] b = new double[2][rounds];
            double[][] c = new double[2][rounds];
            for (int r = 0; r < rounds; r++) {
                double[] x = measure(bare, calls);
                double[] y = measure(ours, calls);
                b[0][r] = x[0];
                b[1][r] = x[1];
                c[0][r] = y[0];
                c[1][r] = y[1];
            }
            report(calls, rounds, b, c);
        } finally {
            channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    /** {wall µs per call, process CPU µs per call}. */
    private static double[] measure(Call call, int n) throws Exception {
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        long cpu0 = os.getProcessCpuTime();
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) {
            call.run();
        }
        long wall = System.nanoTime() - t0;
        long cpu = os.getProcessCpuTime() - cpu0;
        return new double[] {wall / 1e3 / n, cpu / 1e3 / n};
    }

    private static double median(double[] xs) {
        double[] s = xs.clone();
        Arrays.sort(s);
        return s.length % 2 == 1 ? s[s.length / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
    }

    private static void report(int calls, int rounds, double[][] bare, double[][] client) {
        double bw = median(bare[0]), cw = median(client[0]), bc = median(bare[1]), cc = median(client[1]);
        System.out.printf("java Submit overhead (%d rounds of %d sequential L1 duplicates each, medians):%n",
                rounds, calls);
        System.out.printf("  bare stub: %8.1f us/call wall, %8.1f us/call client CPU%n", bw, bc);
        System.out.printf("  client:    %8.1f us/call wall, %8.1f us/call client CPU%n", cw, cc);
        System.out.printf("  overhead:  %+8.1f us/call wall (x%.3f), %+8.1f us/call client CPU (x%.3f)%n",
                cw - bw, cw / bw, cc - bc, cc / bc);
    }
}
