package oncegate_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	oncegate "github.com/oncegate/oncegate/clients/go"
	"github.com/oncegate/oncegate/clients/go/internal/testsidecar"
)

// The shared vectors (clients/vectors/), read by every language's tests.
func vectorsPath(name string) string { return filepath.Join("..", "vectors", name) }

type keyVector struct {
	Name          string `json:"name"`
	PayloadSHA256 string `json:"payload_sha256"`
	DerivedKey    string `json:"derived_key"`
	Key           string `json:"key"`
}

// Every key vector: the payload digest, the derived key and the key (the
// producer's when set) here, and the key in the running sidecar's Decision.
func TestKeyVectors(t *testing.T) {
	raw, err := os.ReadFile(vectorsPath("keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Keys []keyVector `json:"keys"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("keys.json: %v", err)
	}
	subs := keyVectorsFull(t)
	if len(subs) != len(doc.Keys) || len(subs) < 60 {
		t.Fatalf("%d key vectors", len(subs))
	}
	for i, v := range doc.Keys {
		s := subs[i]
		if got := oncegate.PayloadDigest(s.Payload); got != v.PayloadSHA256 {
			t.Errorf("%s: payload digest %s, vector %s", v.Name, got, v.PayloadSHA256)
		}
		if got := oncegate.DeriveKey(s.AwardID, s.SubmissionTimestamp, s.Payload); got != v.DerivedKey {
			t.Errorf("%s: derived key %s, vector %s", v.Name, got, v.DerivedKey)
		}
		if s.Key() != v.Key {
			t.Errorf("%s: key %s, vector %s", v.Name, s.Key(), v.Key)
		}
	}
	gate := dial(t, testsidecar.Start(t, t.TempDir()))
	for i, d := range submitAll(t, gate, subs) {
		if d.IdempotencyKey != doc.Keys[i].Key {
			t.Errorf("%s: the sidecar's key %s, vector %s", doc.Keys[i].Name, d.IdempotencyKey, doc.Keys[i].Key)
		}
	}
	fmt.Printf("parity: %d key vectors (digest, derived key, key; the sidecar's Decision)\n", len(subs))
}

// A pool of printable characters from several planes, as the Python tests'.
var printable = func() []rune {
	var pool []rune
	for _, r := range [][2]rune{{0x21, 0x7E}, {0xA1, 0x24F}, {0x370, 0x4FF}, {0x4E00, 0x4FFF}, {0x1F300, 0x1F64F}, {0x10400, 0x1044F}} {
		for c := r[0]; c <= r[1]; c++ {
			if c != '|' && oncegate.RefusedAwardIDChar(c) == "" && unicode.In(c, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S) {
				pool = append(pool, c)
			}
		}
	}
	return pool
}()

var offsets = []string{"Z", "+00:00", "-00:00", "+05:30", "-08:00", "+14:00", "-12:00", "+09:45"}

func randomSubmission(rng *rand.Rand, award string) oncegate.Submission {
	if award == "" {
		n := 1 + rng.IntN(32)
		rs := make([]rune, n)
		for i := range rs {
			rs[i] = printable[rng.IntN(len(printable))]
		}
		award = string(rs)
	}
	ts := fmt.Sprintf("%04d-%02d-%02dT%02d:%02d:%02d", 1970+rng.IntN(130), 1+rng.IntN(12), 1+rng.IntN(28),
		rng.IntN(24), rng.IntN(60), rng.IntN(60))
	if digits := []int{0, 0, 1, 3, 6, 9}[rng.IntN(6)]; digits > 0 {
		ts += "." + strconv.Itoa(rng.IntN(1_000_000_000))[:1] + strings.Repeat("7", digits-1)
	}
	ts += offsets[rng.IntN(len(offsets))]
	size := []int{0, 1, 2, 16, 64, 255, 1024, rng.IntN(8193)}[rng.IntN(8)]
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(rng.UintN(256))
	}
	return oncegate.Submission{AwardID: award, SubmissionTimestamp: ts, Payload: payload, AmountCents: 1 + rng.Int64N(1_000_000_000)}
}

func seed(t *testing.T) uint64 {
	if s, err := strconv.ParseUint(os.Getenv("ONCEGATE_TEST_SEED"), 10, 64); err == nil && s != 0 {
		return s
	}
	s := uint64(time.Now().UnixNano())
	t.Logf("seed: ONCEGATE_TEST_SEED=%d", s)
	return s
}

func corpus(t *testing.T, n int) []oncegate.Submission {
	rng := rand.New(rand.NewPCG(seed(t), 40))
	subs := make([]oncegate.Submission, n)
	for i := range subs {
		subs[i] = randomSubmission(rng, "")
	}
	subs[0] = oncegate.Submission{AwardID: "A", SubmissionTimestamp: "2026-11-29T10:57:45Z", AmountCents: 1}
	subs[1] = oncegate.Submission{AwardID: strings.Repeat("x", 128), SubmissionTimestamp: "2026-11-29T10:57:45.123456789+05:30",
		Payload: make([]byte, 1024), AmountCents: 2}
	subs[2] = oncegate.Submission{AwardID: strings.Repeat("🚀", 32), SubmissionTimestamp: "1999-12-31T23:59:59-00:00",
		Payload: []byte("grüße"), AmountCents: 3}
	return subs
}

// The same key three ways: DeriveKey, `oncegate key --jsonl`, and the key in
// the running sidecar's Decision.
func TestKeyParityWithTheSidecar(t *testing.T) {
	subs := corpus(t, 1000)
	var in bytes.Buffer
	for _, s := range subs {
		line, _ := json.Marshal(map[string]string{"award_id": s.AwardID, "submission_timestamp": s.SubmissionTimestamp,
			"payload_b64": base64.StdEncoding.EncodeToString(s.Payload)})
		in.Write(append(line, '\n'))
	}
	cmd := exec.Command(testsidecar.Binary(t), "key", "--jsonl")
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("oncegate key --jsonl: %v", err)
	}
	cli := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(cli) != len(subs) {
		t.Fatalf("oncegate key printed %d keys for %d submissions", len(cli), len(subs))
	}
	gate := dial(t, testsidecar.Start(t, t.TempDir()))
	decided := submitAll(t, gate, subs)
	for i, s := range subs {
		want := oncegate.DeriveKey(s.AwardID, s.SubmissionTimestamp, s.Payload)
		if cli[i] != want || decided[i].IdempotencyKey != want || decided[i].Outcome != oncegate.Claimed {
			t.Fatalf("submission %d (award %q ts %q): Go %s, CLI %s, sidecar %s %s", i, s.AwardID,
				s.SubmissionTimestamp, want, cli[i], decided[i].IdempotencyKey, decided[i].Outcome)
		}
	}
	for _, s := range subs[:50] {
		again, err := gate.Submit(context.Background(), s)
		if err != nil || again.Outcome != oncegate.Duplicate || again.IdempotencyKey != s.Key() {
			t.Fatalf("redelivery: %+v %v", again, err)
		}
	}
	fmt.Printf("parity: %d random submissions, Go == oncegate key == the sidecar's Decision\n", len(subs))
}

func dial(t *testing.T, s *testsidecar.Sidecar) *oncegate.Client {
	t.Helper()
	c, err := oncegate.Dial(s.Target, oncegate.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// submitAll submits each with Submit, eight at a time.
func submitAll(t *testing.T, gate *oncegate.Client, subs []oncegate.Submission) []*oncegate.Decision {
	t.Helper()
	out := make([]*oncegate.Decision, len(subs))
	errs := make([]error, len(subs))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i], errs[i] = gate.Submit(context.Background(), subs[i])
			}
		}()
	}
	for i := range subs {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("submission %d (award %q): %v", i, subs[i].AwardID, err)
		}
	}
	return out
}
