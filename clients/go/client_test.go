package oncegate_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	oncegate "github.com/oncegate/oncegate/clients/go"
	"github.com/oncegate/oncegate/clients/go/internal/testsidecar"
)

// The generated code is what the pinned generators make of proto/ today.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	cmd := exec.Command("go", "-C", "internal/generate", "run", ".", "-check")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// The table, code by code (the Python client's).
func TestErrorTable(t *testing.T) {
	cases := []struct {
		code      codes.Code
		message   string
		kind      oncegate.Kind
		retryable bool
		poison    bool
		action    oncegate.Action
	}{
		{codes.InvalidArgument, "award_id is required", oncegate.KindInvalidSubmission, false, true, oncegate.DeadLetter},
		{codes.FailedPrecondition, "idempotency key reused with a different submission", oncegate.KindKeyReused, false, true, oncegate.DeadLetter},
		{codes.FailedPrecondition, "lease lost: the token does not hold this record's current lease", oncegate.KindLeaseLost, false, false, oncegate.Hold},
		{codes.Unavailable, "store unreachable", oncegate.KindUnavailable, true, false, oncegate.Retry},
		{codes.ResourceExhausted, "too many requests in flight", oncegate.KindResourceExhausted, true, false, oncegate.Retry},
		{codes.DeadlineExceeded, "deadline", oncegate.KindDeadlineExceeded, true, false, oncegate.Retry},
		{codes.Aborted, "", oncegate.KindRetryable, true, false, oncegate.Retry},
		{codes.Internal, "internal error", oncegate.KindRetryable, true, false, oncegate.Retry},
		{codes.Unknown, "", oncegate.KindRetryable, true, false, oncegate.Retry},
		{codes.Canceled, "", oncegate.KindRetryable, true, false, oncegate.Retry},
		{codes.Unauthenticated, "", oncegate.KindOther, false, false, oncegate.Hold},
		{codes.PermissionDenied, "", oncegate.KindOther, false, false, oncegate.Hold},
		{codes.Unimplemented, "", oncegate.KindOther, false, false, oncegate.Hold},
		{codes.NotFound, "", oncegate.KindOther, false, false, oncegate.Hold},
	}
	for _, c := range cases {
		e := oncegate.ErrorForStatus(c.code, c.message)
		if e.Kind != c.kind || e.Retryable() != c.retryable || e.Poison() != c.poison || oncegate.ActionFor(e) != c.action {
			t.Errorf("%s %q: kind %v retryable %v poison %v action %v", oncegate.CodeName(c.code), c.message,
				e.Kind, e.Retryable(), e.Poison(), oncegate.ActionFor(e))
		}
		if c.retryable != errors.Is(e, oncegate.ErrRetryable) {
			t.Errorf("%s: errors.Is(ErrRetryable) = %v", oncegate.CodeName(c.code), !c.retryable)
		}
	}
	if oncegate.ActionFor(nil) != oncegate.Ack || oncegate.CodeName(codes.Canceled) != "CANCELLED" {
		t.Error("nil is Ack; CANCELLED is spelled as gRPC spells it")
	}
}

func sub(award, ts, payload string, amount int64) oncegate.Submission {
	return oncegate.Submission{AwardID: award, SubmissionTimestamp: ts, Payload: []byte(payload), AmountCents: amount}
}

const ts = "2026-11-29T10:57:45Z"

// Every outcome of the API against the real sidecar, as the errors a Go
// consumer sees.
func TestOutcomesAndErrorsFromTheRealSidecar(t *testing.T) {
	sc := testsidecar.Start(t, t.TempDir(), "ONCEGATE_MAX_PAYLOAD_BYTES=1000")
	gate := dial(t, sc)
	ctx := context.Background()

	first, err := gate.Submit(ctx, sub("AWD-1", ts, "p", 125_000))
	if err != nil || first.Outcome != oncegate.Claimed || first.Disbursement.Sequence != 1 || first.DecidedBy != oncegate.Database {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := gate.Submit(ctx, sub("AWD-1", ts, "p", 125_000))
	if err != nil || again.Outcome != oncegate.Duplicate || *again.Disbursement != *first.Disbursement || oncegate.ActionFor(err) != oncegate.Ack {
		t.Fatalf("duplicate: %+v %v", again, err)
	}
	found, err := gate.Lookup(ctx, first.IdempotencyKey)
	if err != nil || found == nil || *found.Disbursement != *first.Disbursement {
		t.Fatalf("lookup: %+v %v", found, err)
	}
	if none, err := gate.Lookup(ctx, oncegate.DeriveKey("AWD-none", ts, nil)); none != nil || err != nil {
		t.Fatalf("lookup of an unknown key: %+v %v", none, err)
	}

	expectKind(t, "bad timestamp", oncegate.KindInvalidSubmission, "submission_timestamp",
		call(gate.Submit(ctx, sub("AWD-1", "yesterday", "p", 1))))
	expectKind(t, "invalid UTF-8 (never sent)", oncegate.KindInvalidSubmission, "award_id is not valid UTF-8",
		call(gate.Submit(ctx, sub("AWD-\xff", ts, "p", 1))))
	reused := sub("AWD-2", ts, "one", 100)
	reused.IdempotencyKey = "intent-1"
	if _, err := gate.Submit(ctx, reused); err != nil {
		t.Fatal(err)
	}
	reused.AmountCents = 200
	expectKind(t, "key reuse", oncegate.KindKeyReused, "idempotency key reused", call(gate.Submit(ctx, reused)))
	expectKind(t, "payload over the limit", oncegate.KindResourceExhausted, "payload is 1001 bytes",
		call(gate.Submit(ctx, oncegate.Submission{AwardID: "AWD-3", SubmissionTimestamp: ts, Payload: make([]byte, 1001), AmountCents: 1})))
	expired, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-expired.Done()
	expectKind(t, "deadline", oncegate.KindDeadlineExceeded, "", call(gate.Submit(expired, sub("AWD-4", ts, "p", 1))))
	_, err = gate.Health(ctx, "no.such.Service")
	expectKind(t, "unknown health service", oncegate.KindOther, "", err)
	if st, err := gate.Health(ctx, "oncegate.v1.Gate"); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", st, err)
	}

	batch, err := gate.SubmitBatch(ctx, []oncegate.Submission{sub("AWD-5", ts, "a", 1), sub("AWD-5", ts, "a", 1), sub("", ts, "b", 1)})
	if err != nil || len(batch) != 3 || batch[0].Decision.Outcome != oncegate.Claimed ||
		batch[1].Decision.Outcome != oncegate.Duplicate || batch[2].Err.Kind != oncegate.KindInvalidSubmission {
		t.Fatalf("batch: %+v %v", batch, err)
	}

	if code := sc.Stop(); code != 0 {
		t.Fatalf("sidecar exit %d", code)
	}
	expectKind(t, "sidecar gone", oncegate.KindUnavailable, "", call(gate.Submit(ctx, sub("AWD-6", ts, "p", 1))))
}

func call(_ *oncegate.Decision, err error) error { return err }

func expectKind(t *testing.T, what string, kind oncegate.Kind, inMessage string, err error) {
	t.Helper()
	var e *oncegate.Error
	if !errors.As(err, &e) || e.Kind != kind || !bytes.Contains([]byte(e.Message), []byte(inMessage)) {
		t.Fatalf("%s: got %v (%#v), want kind %v with %q", what, err, e, kind, inMessage)
	}
}

// Effects: done once, a failed attempt released, a lost lease refused, too
// large refused before sending.
func TestEffectsAgainstTheRealSidecar(t *testing.T) {
	gate := dial(t, testsidecar.Start(t, t.TempDir()))
	ctx := context.Background()
	calls := 0
	pay := func(ctx context.Context, attempt int32) ([]byte, error) { calls++; return []byte("receipt-1"), nil }
	for range 3 {
		got, err := gate.Effect(ctx, "payments", "draw-1", []byte("instr"), pay)
		if err != nil || string(got) != "receipt-1" {
			t.Fatalf("effect: %q %v", got, err)
		}
	}
	if calls != 1 {
		t.Fatalf("the provider was called %d times", calls)
	}
	refused := errors.New("provider refused")
	if _, err := gate.Effect(ctx, "payments", "draw-2", []byte("i"), func(context.Context, int32) ([]byte, error) {
		return nil, refused
	}); !errors.Is(err, refused) {
		t.Fatalf("a failed effect returns its error: %v", err)
	}
	begun, err := gate.Begin(ctx, "payments", "draw-2", []byte("i"), 0)
	if err != nil || begun.Acquired == nil || begun.Acquired.Attempt != 2 {
		t.Fatalf("after a release the next Begin acquires, attempt 2: %+v %v", begun, err)
	}
	if err := gate.Release(ctx, "payments", "draw-2", begun.Acquired.LeaseToken, "test"); err != nil {
		t.Fatal(err)
	}
	_, err = gate.Complete(ctx, "payments", "draw-2", begun.Acquired.LeaseToken, []byte("late"))
	expectKind(t, "complete after release", oncegate.KindLeaseLost, "lease lost", err)
	_, err = gate.Begin(ctx, "payments", "draw-3", make([]byte, oncegate.EffectMaxBytes+1), 0)
	expectKind(t, "request over 1 MiB", oncegate.KindTooLarge, "request is 1048577 bytes, the limit is 1048576 bytes", err)
	if oncegate.ActionFor(err) != oncegate.DeadLetter {
		t.Fatal("TooLarge is poison")
	}
}
