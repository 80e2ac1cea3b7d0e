package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	oncegate "github.com/oncegate/oncegate/clients/go"
	"github.com/oncegate/oncegate/clients/go/internal/testsidecar"
)

func port(t *testing.T, addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// The sidecar goes away while messages wait: retryable errors, the batch
// aborted and read again after a backoff, nothing dead-lettered; back, and
// every message is decided once.
func TestConsumerWaitsOutASidecarOutage(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	unique := strconv.FormatUint(rng.Uint64()%1_000_000_000, 36)
	topic, dlt, group := "oncegate-gotest."+unique, "oncegate-gotest."+unique+".dead", "gotest-"+unique
	createTopics(t, map[string]int32{topic: 2, dlt: 1})
	batch := func(prefix string) ([]message, []oncegate.Submission) {
		var msgs []message
		var subs []oncegate.Submission
		for i := range 40 {
			s := oncegate.Submission{AwardID: fmt.Sprintf("AWD-%s-%d", unique, i%3), SubmissionTimestamp: ts,
				Payload: []byte(fmt.Sprintf("%s-%d-%d", prefix, i, rng.Uint64())), AmountCents: 1 + rng.Int64N(100_000)}
			subs = append(subs, s)
			msgs = append(msgs, message{id: fmt.Sprintf("%s%d", prefix, i), kind: "valid", key: []byte(s.AwardID), value: bodyOf(s), sub: s})
		}
		return msgs, subs
	}
	firstMsgs, first := batch("f")
	secondMsgs, second := batch("s")
	dir := t.TempDir()
	sc := testsidecar.Start(t, dir)
	consumer := startConsumer(t, buildExample(t), "gc-"+unique, []string{"--bootstrap-servers", bootstrap(t), "--topic", topic,
		"--group", group, "--dead-letter-topic", dlt, "--target", sc.Target, "--timeout", "2s"})
	produce(t, topic, firstMsgs, true)
	waitFor(t, 60*time.Second, "the first 40 in the ledger", func() bool { return ledgerCount(t, sc) >= 40 }, consumer)

	if code := sc.Stop(); code != 0 {
		t.Fatalf("sidecar exit %d", code)
	}
	produce(t, topic, secondMsgs, true)
	errorsSeen := func() int {
		n := 0
		for _, l := range consumer.snapshot() {
			if l["outcome"] == "ERROR" {
				n++
			}
		}
		return n
	}
	waitFor(t, 60*time.Second, "the consumer to meet the outage three times", func() bool { return errorsSeen() >= 3 }, consumer)
	if n := ledgerCount(t, sc); n != 40 {
		t.Fatalf("the ledger changed while the sidecar was down: %d rows", n)
	}
	sc = testsidecar.StartOn(t, dir, port(t, sc.Target), port(t, sc.Metrics))
	waitFor(t, 90*time.Second, "the second 40 after the outage", func() bool { return ledgerCount(t, sc) >= 80 }, consumer)
	if code := consumer.terminate(t); code != 0 {
		t.Fatalf("consumer exit %d\n%s", code, consumer.logTail())
	}
	all := append(append([]message(nil), firstMsgs...), secondMsgs...)
	checkLedger(t, sc, append(append([]oncegate.Submission(nil), first...), second...), nil)
	claimed := map[string]int{}
	for _, l := range consumer.snapshot() {
		switch l["outcome"] {
		case "ERROR":
			if l["retryable"] != true {
				t.Fatalf("a non-retryable error during an outage: %v", l)
			}
		case "DEAD_LETTER":
			t.Fatalf("an outage must not dead-letter: %v", l)
		case "CLAIMED":
			claimed[l["key"].(string)]++
		}
	}
	for _, m := range all {
		if claimed[m.sub.Key()] != 1 {
			t.Fatalf("message %s CLAIMED %d times", m.id, claimed[m.sub.Key()])
		}
	}
	fmt.Printf("kafka go outage: %d retryable errors while the sidecar was down, 80 decided once, nothing dead-lettered\n", errorsSeen())
}
