package oncegate_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	oncegate "github.com/oncegate/oncegate/clients/go"
	"github.com/oncegate/oncegate/clients/go/internal/testsidecar"
	pb "github.com/oncegate/oncegate/clients/go/oncegatev1"
)

// What the client layer costs per Submit over the bare generated stub, on
// one connection to a real sidecar, in the same run: L1 duplicates (the
// sidecar answers from its in-process cache, so it is not the bottleneck),
// one call at a time, rounds interleaved (stub, client, stub, ...), a
// warm-up first, medians of the rounds. Wall time and this process's CPU
// time per call. ONCEGATE_OVERHEAD_CALLS and _ROUNDS size it.
func TestOverheadPerSubmitAgainstTheBareStub(t *testing.T) {
	calls, rounds := envInt("ONCEGATE_OVERHEAD_CALLS", 1000), envInt("ONCEGATE_OVERHEAD_ROUNDS", 5)
	sc := testsidecar.Start(t, t.TempDir())
	conn, err := grpc.NewClient(sc.Target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stub, client := pb.NewGateClient(conn), oncegate.New(conn)
	s := oncegate.Submission{AwardID: "AWD-bench", SubmissionTimestamp: "2026-11-29T10:57:45Z", Payload: make([]byte, 256), AmountCents: 100}
	key := s.Key()
	raw := &pb.Submission{AwardId: s.AwardID, SubmissionTimestamp: s.SubmissionTimestamp, Payload: s.Payload, AmountCents: s.AmountCents}

	runStub := func(n int) {
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			d, err := stub.Submit(ctx, raw)
			cancel()
			if err != nil || d.GetIdempotencyKey() != key {
				t.Fatalf("stub: %v %v", d, err)
			}
		}
	}
	runClient := func(n int) {
		for range n {
			d, err := client.Submit(context.Background(), s)
			if err != nil || d.IdempotencyKey != key {
				t.Fatalf("client: %v %v", d, err)
			}
		}
	}
	runClient(1) // claim it; from here on every call is an L1 duplicate
	runStub(calls / 2)
	runClient(calls / 2)
	if d, _ := client.Submit(context.Background(), s); d.Outcome != oncegate.Duplicate || d.DecidedBy != oncegate.LocalCache {
		t.Fatalf("expected L1 duplicates, got %+v", d)
	}
	var stubWall, clientWall, stubCPU, clientCPU []float64
	for range rounds {
		w, c := measure(calls, runStub)
		stubWall, stubCPU = append(stubWall, w), append(stubCPU, c)
		w, c = measure(calls, runClient)
		clientWall, clientCPU = append(clientWall, w), append(clientCPU, c)
	}
	sw, cw, scpu, ccpu := median(stubWall), median(clientWall), median(stubCPU), median(clientCPU)
	fmt.Printf("overhead go: per Submit (L1 duplicate, %d calls x %d rounds, medians): bare stub %.1f µs wall %.1f µs CPU; "+
		"client %.1f µs wall %.1f µs CPU; overhead %+.1f µs wall (%.2fx), %+.1f µs CPU (%.2fx)\n",
		calls, rounds, sw, scpu, cw, ccpu, cw-sw, cw/sw, ccpu-scpu, ccpu/scpu)
}

// measure runs f(n) and gives wall and CPU (user + system of this process)
// microseconds per call.
func measure(n int, f func(int)) (wall, cpu float64) {
	c0, t0 := cpuTime(), time.Now()
	f(n)
	wall = float64(time.Since(t0).Microseconds()) / float64(n)
	cpu = float64((cpuTime() - c0).Microseconds()) / float64(n)
	return wall, cpu
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func envInt(name string, fallback int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return fallback
}
