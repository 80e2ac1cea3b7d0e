package oncegate

import (
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	pb "github.com/oncegate/oncegate/clients/go/oncegatev1"
)

// Submission is one delivery's content (DESIGN §1).
type Submission struct {
	// 1-128 printable characters, no '|', no leading or trailing white space.
	AwardID string
	// RFC 3339 date-time, used verbatim in the key (never normalised).
	SubmissionTimestamp string
	// Opaque bytes, at most the sidecar's limit (1 MiB by default). Never logged.
	Payload []byte
	// Positive amount in cents.
	AmountCents int64
	// The producer's own key (a UUID per intent, say); empty: derived.
	IdempotencyKey string
}

// utf8Problem: a string field that is not valid UTF-8 cannot be sent at all
// (protobuf refuses to encode it); it is the message's fault, so it is an
// InvalidSubmission (dead-letter), never a transport error to retry.
func (s Submission) utf8Problem() string {
	for _, f := range [...]struct{ name, value string }{
		{"award_id", s.AwardID}, {"submission_timestamp", s.SubmissionTimestamp}, {"idempotency_key", s.IdempotencyKey},
	} {
		if !utf8.ValidString(f.value) {
			return f.name + " is not valid UTF-8"
		}
	}
	return ""
}

func (s Submission) proto() *pb.Submission {
	m := &pb.Submission{
		AwardId:             s.AwardID,
		SubmissionTimestamp: s.SubmissionTimestamp,
		Payload:             s.Payload,
		AmountCents:         s.AmountCents,
	}
	if s.IdempotencyKey != "" {
		m.IdempotencyKey = &s.IdempotencyKey
	}
	return m
}

// Outcome of a decision.
type Outcome string

const (
	Claimed   Outcome = "CLAIMED"
	Duplicate Outcome = "DUPLICATE"
)

// Tier that decided.
type Tier string

const (
	LocalCache Tier = "LOCAL_CACHE"
	Redis      Tier = "REDIS"
	Database   Tier = "DATABASE"
)

// Disbursement is the ledger row the first delivery wrote; identical on
// every duplicate.
type Disbursement struct {
	ID          string
	AwardID     string
	AmountCents int64
	RecordedAt  string // RFC 3339 UTC with microseconds
	Sequence    int64  // per award, 1, 2, 3, ... in commit order
}

// Decision is the sidecar's answer to a submission.
type Decision struct {
	Outcome        Outcome
	IdempotencyKey string
	Disbursement   *Disbursement
	DecidedBy      Tier
}

// BatchResult is one item of SubmitBatch: a Decision or an *Error.
type BatchResult struct {
	Decision *Decision
	Err      *Error
}

func decisionOf(d *pb.Decision) *Decision {
	out := &Decision{
		Outcome:        Outcome(d.GetOutcome().String()),
		IdempotencyKey: d.GetIdempotencyKey(),
		DecidedBy:      Tier(d.GetDecidedBy().String()),
	}
	if b := d.GetDisbursement(); b != nil {
		out.Disbursement = &Disbursement{
			ID: b.GetId(), AwardID: b.GetAwardId(), AmountCents: b.GetAmountCents(),
			RecordedAt: b.GetRecordedAt(), Sequence: b.GetSequence(),
		}
	}
	return out
}

func batchResult(r *pb.Result) BatchResult {
	switch v := r.GetResult().(type) {
	case *pb.Result_Decision:
		return BatchResult{Decision: decisionOf(v.Decision)}
	case *pb.Result_Error:
		return BatchResult{Err: ErrorForStatus(codes.Code(v.Error.GetCode()), v.Error.GetMessage())}
	}
	return BatchResult{Err: ErrorForStatus(codes.Unknown, "sidecar returned an empty result")}
}
