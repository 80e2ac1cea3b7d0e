package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	oncegate "github.com/oncegate/oncegate/clients/go"
)

// The suite's Kafka: ONCEGATE_TEST_KAFKA_BOOTSTRAP or KAFKA_BOOTSTRAP, else
// 127.0.0.1:9092 when something listens there (scripts/test starts one).
func bootstrap(t *testing.T) string {
	for _, name := range []string{"ONCEGATE_TEST_KAFKA_BOOTSTRAP", "KAFKA_BOOTSTRAP"} {
		if v := os.Getenv(name); v != "" {
			return v
		}
	}
	c, err := net.DialTimeout("tcp", "127.0.0.1:9092", 2*time.Second)
	if err != nil {
		t.Skip("no Kafka configured (set KAFKA_BOOTSTRAP; scripts/test starts one)")
	}
	c.Close()
	return "127.0.0.1:9092"
}

func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(bootstrap(t), ",")...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func createTopics(t *testing.T, partitions map[string]int32) {
	t.Helper()
	adm := kadm.NewClient(newClient(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for topic, n := range partitions {
		if _, err := adm.CreateTopic(ctx, n, 1, nil, topic); err != nil {
			t.Fatalf("create topic %s: %v", topic, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for topic := range partitions {
			_, _ = adm.DeleteTopic(ctx, topic)
		}
	})
}

type message struct {
	id, kind, code string // kind: valid | poison; code: the poison's expected error
	key, value     []byte
	sub            oncegate.Submission
}

func bodyOf(s oncegate.Submission) []byte {
	doc := map[string]any{"award_id": s.AwardID, "submission_timestamp": s.SubmissionTimestamp,
		"amount_cents": s.AmountCents, "payload": base64.StdEncoding.EncodeToString(s.Payload)}
	if s.IdempotencyKey != "" {
		doc["idempotency_key"] = s.IdempotencyKey
	}
	b, _ := json.Marshal(doc)
	return b
}

// produce writes the messages in one transaction, committed or aborted.
func produce(t *testing.T, topic string, msgs []message, commit bool) {
	t.Helper()
	cl := newClient(t, kgo.TransactionalID(fmt.Sprintf("gotest-%d", rand.Uint64())), kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		r := &kgo.Record{Key: m.key, Value: m.value, Headers: []kgo.RecordHeader{{Key: "message_id", Value: []byte(m.id)}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

// readAll reads a topic read_committed: at least expect records, then a quiet 1.5 s.
func readAll(t *testing.T, topic string, expect int) []*kgo.Record {
	cl := newClient(t, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var found []*kgo.Record
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		fetches := cl.PollFetches(ctx)
		cancel()
		n := len(fetches.Records())
		found = append(found, fetches.Records()...)
		if n == 0 && len(found) >= expect {
			break
		}
	}
	return found
}

// proc is one running example, its stdout lines parsed.
type proc struct {
	name  string
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []map[string]any
	log   string
	done  chan struct{}
}

func startConsumer(t *testing.T, bin, name string, args []string) *proc {
	t.Helper()
	p := &proc{name: name, log: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"--consumer", name}, args...)...)
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test binary
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.mu.Unlock()
		}
		_ = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p
}

func (p *proc) snapshot() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.lines...)
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) terminate(t *testing.T) int {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not stop within 60 s of SIGTERM\n%s", p.name, p.logTail())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(string(b), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

// decisions counts the decision lines (CLAIMED, DUPLICATE, DEAD_LETTER).
func decisions(lines []map[string]any) int {
	n := 0
	for _, l := range lines {
		if o, ok := l["outcome"].(string); ok && o != "ERROR" {
			n++
		}
	}
	return n
}

// holdsUndecided: the last line is a decision: a batch is decided in part
// or whole and not yet committed.
func holdsUncommitted(lines []map[string]any) bool {
	return len(lines) > 0 && lines[len(lines)-1]["outcome"] != nil
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool, procs ...*proc) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	var tails []string
	for _, p := range procs {
		tails = append(tails, "--- "+p.name+"\n"+p.logTail())
	}
	t.Fatalf("timed out waiting for %s\n%s", what, strings.Join(tails, "\n"))
}
