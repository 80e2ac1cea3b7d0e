package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	oncegate "github.com/oncegate/oncegate/clients/go"
	"github.com/oncegate/oncegate/clients/go/internal/testsidecar"
)

const ts = "2026-11-29T10:57:45Z"

// corpus: 600 unique submissions on 6 awards (every tenth with a producer
// key), 100 producer duplicates, 6 poison messages, shuffled; and 20 for an
// aborted transaction.
func corpus(rng *rand.Rand, unique string) (msgs []message, subs []oncegate.Submission, aborted []oncegate.Submission) {
	award := func(i int) string { return fmt.Sprintf("AWD-%s-%d", unique, i) }
	random := func(a string) oncegate.Submission {
		payload := make([]byte, rng.IntN(1024))
		for i := range payload {
			payload[i] = byte(rng.UintN(256))
		}
		return oncegate.Submission{AwardID: a, Payload: payload, AmountCents: 1 + rng.Int64N(10_000_000),
			SubmissionTimestamp: fmt.Sprintf("2026-%02d-%02dT%02d:%02d:%02d.%06dZ", 1+rng.IntN(12), 1+rng.IntN(28),
				rng.IntN(24), rng.IntN(60), rng.IntN(60), rng.IntN(1_000_000))}
	}
	for i := range 600 {
		s := random(award(rng.IntN(6)))
		if i%10 == 0 {
			s.IdempotencyKey = fmt.Sprintf("intent-%s-%d", unique, i)
		}
		subs = append(subs, s)
	}
	valid := append([]oncegate.Submission(nil), subs...)
	for range 100 {
		valid = append(valid, subs[rng.IntN(len(subs))])
	}
	for _, s := range valid {
		msgs = append(msgs, message{kind: "valid", key: []byte(s.AwardID), value: bodyOf(s), sub: s})
	}
	poison := []struct{ body, code string }{
		{string(bodyOf(oncegate.Submission{AwardID: award(0), SubmissionTimestamp: "yesterday", Payload: []byte("x"), AmountCents: 100})), "INVALID_ARGUMENT"},
		{string(bodyOf(oncegate.Submission{AwardID: award(1), SubmissionTimestamp: ts, Payload: []byte("zero"), AmountCents: 0})), "INVALID_ARGUMENT"},
		{string(bodyOf(oncegate.Submission{AwardID: award(2), SubmissionTimestamp: "2026-02-30T10:00:00Z", Payload: []byte("y"), AmountCents: 5})), "INVALID_ARGUMENT"},
		{"not json", "MALFORMED"}, {"[1, 2]", "MALFORMED"},
		{fmt.Sprintf(`{"award_id": %q, "submission_timestamp": %q, "amount_cents": 1.5}`, award(0), ts), "MALFORMED"},
	}
	for _, p := range poison {
		msgs = append(msgs, message{kind: "poison", code: p.code, key: []byte("poison"), value: []byte(p.body)})
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	for i := range msgs {
		msgs[i].id = fmt.Sprintf("m%d", i)
	}
	for range 20 {
		aborted = append(aborted, random(award(3)))
	}
	return msgs, subs, aborted
}

func buildExample(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kafka-consumer")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Two members of one group on three partitions; twice, a member holding a
// decided but uncommitted batch is SIGKILLed (each in turn when both hold
// one) and restarted under its name; then an exact ledger and exactly the
// poison in the dead-letter topic.
func TestConsumersKilledInAGroupGiveAnExactLedger(t *testing.T) {
	started := time.Now()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	unique := strconv.FormatUint(rng.Uint64()%1_000_000_000, 36)
	topic, dlt, group := "oncegate-gotest."+unique, "oncegate-gotest."+unique+".dead", "gotest-"+unique
	createTopics(t, map[string]int32{topic: 3, dlt: 1})
	msgs, subs, aborted := corpus(rng, unique)
	produce(t, topic, msgs, true)
	var abortedMsgs []message
	for i, s := range aborted {
		abortedMsgs = append(abortedMsgs, message{id: fmt.Sprintf("aborted%d", i), key: []byte("a"), value: bodyOf(s)})
	}
	produce(t, topic, abortedMsgs, false)

	sc := testsidecar.Start(t, t.TempDir())
	bin := buildExample(t)
	args := []string{"--bootstrap-servers", bootstrap(t), "--topic", topic, "--group", group, "--dead-letter-topic", dlt,
		"--target", sc.Target, "--session-timeout", "6s", "--max-rate", "40", "--batch", "20"}
	names := []string{"gc-" + unique + "-a", "gc-" + unique + "-b"}
	slots := []*proc{startConsumer(t, bin, names[0], args), startConsumer(t, bin, names[1], args)}
	all := append([]*proc(nil), slots...)
	decided := func() int {
		n := 0
		for _, p := range all {
			n += decisions(p.snapshot())
		}
		return n
	}
	var kills []string
	for round := range 2 {
		// The victim: a member holding an uncommitted batch, this round's
		// slot when it does (a member whose partitions are all decided holds
		// none, and may never again).
		target, victim := decided()+120, -1
		waitFor(t, 90*time.Second, fmt.Sprintf("%d decisions, then a member holding an uncommitted batch", target), func() bool {
			if decided() < target {
				return false
			}
			for _, i := range []int{round, 1 - round} {
				if holdsUncommitted(slots[i].snapshot()) {
					victim = i
					return true
				}
			}
			return false
		}, all...)
		p := slots[victim]
		p.kill()
		kills = append(kills, fmt.Sprintf("%s after %d decisions", p.name, decisions(p.snapshot())))
		slots[victim] = startConsumer(t, bin, p.name, args) // same name: fences its transaction
		all = append(all, slots[victim])
	}
	chaos := time.Now()
	waitFor(t, 180*time.Second, "every unique submission in the ledger",
		func() bool { return ledgerCount(t, sc) >= len(subs) }, all...)
	for _, p := range slots {
		if code := p.terminate(t); code != 0 {
			t.Fatalf("%s exited %d on SIGTERM\n%s", p.name, code, p.logTail())
		}
	}
	dead := readAll(t, dlt, 6) // after the stop: nothing more can arrive
	checkLedger(t, sc, subs, aborted)
	checkDeadLetters(t, dead, msgs)
	outcomes := checkLines(t, all, msgs, subs)
	fmt.Printf("kafka go: %d messages (%d unique, 100 producer duplicates, 6 poison) + 20 aborted; SIGKILLs: %s; "+
		"ledger %d rows exact; dead-letter topic %d; outcomes %v; produce+start %.1fs, chaos+finish %.1fs\n",
		len(msgs), len(subs), strings.Join(kills, ", "), ledgerCount(t, sc), len(dead), outcomes,
		chaos.Sub(started).Seconds(), time.Since(chaos).Seconds())
}

// sqlite runs a read-only query on the sidecar's store with the sqlite3 CLI.
func sqlite(t *testing.T, sc *testsidecar.Sidecar, query string) string {
	t.Helper()
	out, err := exec.Command("sqlite3", "-readonly", filepath.Join(sc.Dir, "oncegate.db"), query).Output()
	if err != nil {
		t.Fatalf("sqlite3 %q: %v", query, err)
	}
	return strings.TrimSpace(string(out))
}

func ledgerCount(t *testing.T, sc *testsidecar.Sidecar) int {
	n, _ := strconv.Atoi(sqlite(t, sc, "select count(*) from disbursements"))
	return n
}

// checkLedger: one disbursement per unique submission (Lookup of each key and
// the store read directly), exact totals, dense sequences, nothing aborted.
func checkLedger(t *testing.T, sc *testsidecar.Sidecar, subs, aborted []oncegate.Submission) {
	t.Helper()
	gate, err := oncegate.Dial(sc.Target)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Close()
	want := map[string][2]int64{}
	for _, s := range subs {
		d, err := gate.Lookup(context.Background(), s.Key())
		if err != nil || d == nil || d.Disbursement.AwardID != s.AwardID || d.Disbursement.AmountCents != s.AmountCents {
			t.Fatalf("no exact decision stored for key %.12s: %+v %v", s.Key(), d, err)
		}
		w := want[s.AwardID]
		want[s.AwardID] = [2]int64{w[0] + 1, w[1] + s.AmountCents}
	}
	for _, s := range aborted {
		if d, _ := gate.Lookup(context.Background(), s.Key()); d != nil {
			t.Fatal("a message of an aborted transaction took effect")
		}
	}
	if n := ledgerCount(t, sc); n != len(subs) {
		t.Fatalf("ledger has %d rows for %d unique submissions", n, len(subs))
	}
	rows := sqlite(t, sc, "select award_id, count(*), sum(amount_cents), min(sequence), max(sequence), count(distinct sequence) from disbursements group by award_id")
	for _, row := range strings.Split(rows, "\n") {
		f := strings.Split(row, "|")
		n, _ := strconv.ParseInt(f[1], 10, 64)
		sum, _ := strconv.ParseInt(f[2], 10, 64)
		if w := want[f[0]]; w != [2]int64{n, sum} || f[3] != "1" || f[4] != f[1] || f[5] != f[1] {
			t.Fatalf("award %s: ledger %v, expected %d rows totalling %d with sequences 1..n", f[0], f, w[0], w[1])
		}
	}
}

func checkDeadLetters(t *testing.T, dead []*kgo.Record, msgs []message) {
	t.Helper()
	want := map[string]string{} // message id -> code
	for _, m := range msgs {
		if m.kind == "poison" {
			want[m.id] = m.code
		}
	}
	got := map[string]string{}
	for _, r := range dead {
		id := header(r, "message_id")
		if _, twice := got[id]; twice {
			t.Fatalf("message %s twice in the dead-letter topic", id)
		}
		got[id] = header(r, "oncegate_error")
	}
	if fmt.Sprint(sortedPairs(got)) != fmt.Sprint(sortedPairs(want)) {
		t.Fatalf("dead-letter topic: %v, expected %v", got, want)
	}
}

func sortedPairs(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// checkLines: no key CLAIMED twice, every submission decided, the poison
// (and only it) dead-lettered, nothing of the aborted transaction, no error
// in a healthy run.
func checkLines(t *testing.T, procs []*proc, msgs []message, subs []oncegate.Submission) map[string]int {
	t.Helper()
	kind := map[string]message{}
	for _, m := range msgs {
		kind[m.id] = m
	}
	claimed, decidedKeys, outcomes := map[string]int{}, map[string]bool{}, map[string]int{}
	for _, p := range procs {
		for _, l := range p.snapshot() {
			outcome, _ := l["outcome"].(string)
			if outcome == "" {
				continue
			}
			outcomes[outcome]++
			id, _ := l["message_id"].(string)
			m, ok := kind[id]
			switch {
			case !ok:
				t.Fatalf("a line for a message not produced (aborted?): %v", l)
			case outcome == "ERROR":
				t.Fatalf("a sidecar error in a healthy run: %v", l)
			case outcome == "DEAD_LETTER" && (m.kind != "poison" || l["code"] != m.code):
				t.Fatalf("dead-lettered wrongly: %v (expected %s %s)", l, m.kind, m.code)
			case outcome == "CLAIMED" || outcome == "DUPLICATE":
				if m.kind != "valid" || l["key"] != m.sub.Key() {
					t.Fatalf("decided wrongly: %v", l)
				}
				decidedKeys[m.sub.Key()] = true
				if outcome == "CLAIMED" {
					claimed[m.sub.Key()]++
				}
			}
		}
	}
	for k, n := range claimed {
		if n > 1 {
			t.Fatalf("key %.12s CLAIMED %d times", k, n)
		}
	}
	for _, s := range subs {
		if !decidedKeys[s.Key()] {
			t.Fatalf("submission %.12s never decided", s.Key())
		}
	}
	return outcomes
}
