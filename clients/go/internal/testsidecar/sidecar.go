// Package testsidecar starts the real oncegate sidecar for tests: `oncegate
// serve` on free loopback ports, with embedded SQLite in a temporary
// directory or with the Postgres database given, waiting for
// grpc.health.v1 SERVING.
package testsidecar

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Binary is the sidecar: ONCEGATE_BIN, or <repo>/target/debug/oncegate.
// A test that needs it fails when it is missing (scripts/test builds it).
func Binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("ONCEGATE_BIN")
	if bin == "" {
		_, file, _, _ := runtime.Caller(0)
		bin = filepath.Join(filepath.Dir(file), "../../../../target/debug/oncegate")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no oncegate binary at %s (run cargo build, or set ONCEGATE_BIN): %v", bin, err)
	}
	return bin
}

// Sidecar is one running `oncegate serve`.
type Sidecar struct {
	Target  string // host:port of its gRPC listener
	Metrics string // host:port of its metrics listener
	Dir     string // working directory: the SQLite file and the log
	Log     string
	cmd     *exec.Cmd
	done    chan struct{}
}

// FreePort is a loopback port nobody listens on (below the ephemeral range
// is not guaranteed; the kernel hands out one it does not use).
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs a sidecar in dir with the given extra environment ("K=V") and
// waits until it answers SERVING; it is stopped when the test ends.
func Start(t testing.TB, dir string, env ...string) *Sidecar {
	t.Helper()
	return StartOn(t, dir, FreePort(t), FreePort(t), env...)
}

// StartOn is Start on given ports (to restart a sidecar in place).
func StartOn(t testing.TB, dir string, port, metricsPort int, env ...string) *Sidecar {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &Sidecar{
		Target:  fmt.Sprintf("127.0.0.1:%d", port),
		Metrics: fmt.Sprintf("127.0.0.1:%d", metricsPort),
		Dir:     dir,
		Log:     filepath.Join(dir, "oncegate.log"),
		done:    make(chan struct{}),
	}
	log, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	s.cmd = exec.Command(Binary(t), "serve")
	s.cmd.Dir = dir
	s.cmd.Env = append(cleanEnv(),
		"ONCEGATE_LISTEN="+s.Target, "ONCEGATE_METRICS_LISTEN="+s.Metrics,
		"ONCEGATE_SQLITE_PATH="+filepath.Join(dir, "oncegate.db"),
		"ONCEGATE_INSTANCE_ID=gotest-"+filepath.Base(dir), "RUST_LOG=info")
	s.cmd.Env = append(s.cmd.Env, env...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// A test binary that dies (a timeout, a kill) takes its sidecar along.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { s.Stop() })
	s.waitServing(t)
	return s
}

// cleanEnv: a test sidecar gets exactly the configuration the test gives.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ONCEGATE_") || strings.HasPrefix(kv, "DATABASE_URL=") || strings.HasPrefix(kv, "REDIS_URL=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (s *Sidecar) waitServing(t testing.TB) {
	t.Helper()
	conn, err := grpc.NewClient(s.Target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(60 * time.Second)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			t.Fatalf("oncegate serve exited before SERVING: %v\n%s", s.cmd.ProcessState, s.LogTail(40))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if err != nil {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("oncegate serve not SERVING after 60 s (%s)\n%s", last, s.LogTail(40))
}

// Stop sends SIGTERM and waits for the drain (SIGKILL after 25 s); it
// returns the exit code.
func (s *Sidecar) Stop() int {
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(25 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	return s.cmd.ProcessState.ExitCode()
}

// LogTail is the last n lines of the sidecar's log.
func (s *Sidecar) LogTail(n int) string {
	b, err := os.ReadFile(s.Log)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
