package oncegate

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kind says what an error means for the consumer: the Python client's
// exception classes, one to one.
type Kind int

const (
	// KindOther: a status outside the table (UNAUTHENTICATED,
	// PERMISSION_DENIED, UNIMPLEMENTED, ...): a deployment problem, not a
	// message problem. Do not ack; not retryable.
	KindOther Kind = iota
	// KindInvalidSubmission: INVALID_ARGUMENT, bad input, nothing written.
	// Dead-letter, then ack.
	KindInvalidSubmission
	// KindKeyReused: FAILED_PRECONDITION, the idempotency key was used for a
	// different submission. Dead-letter, then ack; investigate the producer.
	KindKeyReused
	// KindLeaseLost: FAILED_PRECONDITION "lease lost" on an effect call: the
	// lease token is no longer the record's lease. Do not Complete.
	KindLeaseLost
	// KindUnavailable: UNAVAILABLE, the sidecar or its store is unreachable.
	// Do not ack; redelivered.
	KindUnavailable
	// KindResourceExhausted: RESOURCE_EXHAUSTED, over the in-flight or size
	// limit. Do not ack; back off.
	KindResourceExhausted
	// KindTooLarge: RESOURCE_EXHAUSTED about a size on an effect call (its
	// request or response over 1 MiB, or the whole message over the
	// sidecar's limit). No retry fixes it: dead-letter.
	KindTooLarge
	// KindDeadlineExceeded: DEADLINE_EXCEEDED, the call's deadline passed.
	// Do not ack; the next Submit resolves whether it committed.
	KindDeadlineExceeded
	// KindRetryable: ABORTED, INTERNAL, UNKNOWN, CANCELLED: transient in
	// gRPC's own sense. Do not ack.
	KindRetryable
)

// The table (the Python client's, DESIGN §1): status code -> kind. Codes
// not in it are KindOther.
var kindByCode = map[codes.Code]Kind{
	codes.InvalidArgument:    KindInvalidSubmission,
	codes.FailedPrecondition: KindKeyReused,
	codes.Unavailable:        KindUnavailable,
	codes.ResourceExhausted:  KindResourceExhausted,
	codes.DeadlineExceeded:   KindDeadlineExceeded,
	codes.Aborted:            KindRetryable,
	codes.Internal:           KindRetryable,
	codes.Unknown:            KindRetryable,
	codes.Canceled:           KindRetryable,
}

var kindNames = map[Kind]string{
	KindOther: "GateError", KindInvalidSubmission: "InvalidSubmission", KindKeyReused: "KeyReused",
	KindLeaseLost: "LeaseLost", KindUnavailable: "Unavailable", KindResourceExhausted: "ResourceExhausted",
	KindTooLarge: "TooLarge", KindDeadlineExceeded: "DeadlineExceeded", KindRetryable: "Retryable",
}

func (k Kind) String() string { return kindNames[k] }

// Retryable: a redelivery (or a retry of the call) can succeed.
func (k Kind) Retryable() bool {
	switch k {
	case KindUnavailable, KindResourceExhausted, KindDeadlineExceeded, KindRetryable:
		return true
	}
	return false
}

// Poison: the message itself is bad; redelivering it fails the same way
// forever. Dead-letter it, then ack.
func (k Kind) Poison() bool {
	return k == KindInvalidSubmission || k == KindKeyReused || k == KindTooLarge
}

// Action is what a consumer does with a delivery after a call.
type Action int

const (
	// Ack: the call returned a decision (CLAIMED or DUPLICATE).
	Ack Action = iota
	// DeadLetter: the message is poison; dead-letter it, then ack.
	DeadLetter
	// Retry: do not ack; the broker's redelivery (or a retry) resolves it.
	Retry
	// Hold: do not ack, and no retry will fix it: a deployment problem
	// (authentication, a missing method, ...). Alert, do not dead-letter.
	Hold
)

func (a Action) String() string {
	return [...]string{"ack", "dead-letter", "retry", "hold"}[a]
}

// ActionFor is the consumer's rule for the result of a call: nil -> Ack, a
// poison error -> DeadLetter, a retryable one -> Retry, anything else ->
// Hold. An error that is not from this package (say, a context error
// before the call) is Retry.
func ActionFor(err error) Action {
	if err == nil {
		return Ack
	}
	var e *Error
	if !errors.As(err, &e) {
		return Retry
	}
	switch {
	case e.Kind.Poison():
		return DeadLetter
	case e.Kind.Retryable():
		return Retry
	}
	return Hold
}

// Error is every error the client returns for an RPC: the status code, the
// sidecar's message (it names the field or cause) and its Kind.
//
//	errors.Is(err, oncegate.ErrKeyReused)   // by kind
//	oncegate.ActionFor(err)                  // ack, dead-letter, retry or hold
type Error struct {
	Code    codes.Code
	Message string
	Kind    Kind
}

func (e *Error) Error() string {
	return fmt.Sprintf("oncegate: %s: %s", codeName(e.Code), e.Message)
}

// Retryable: a redelivery can succeed.
func (e *Error) Retryable() bool { return e.Kind.Retryable() }

// Poison: the message itself is bad; dead-letter it.
func (e *Error) Poison() bool { return e.Kind.Poison() }

// GRPCStatus lets status.FromError see the original code and message.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// Is matches the sentinels below by kind (ErrRetryable: any retryable kind).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Code != sentinel {
		return false
	}
	if t == ErrRetryable {
		return e.Retryable()
	}
	return t.Kind == e.Kind
}

// A code no status has: marks the sentinels.
const sentinel codes.Code = 1 << 30

func sentinelOf(k Kind) *Error { return &Error{Code: sentinel, Kind: k, Message: k.String()} }

// Sentinels for errors.Is.
var (
	ErrInvalidSubmission = sentinelOf(KindInvalidSubmission)
	ErrKeyReused         = sentinelOf(KindKeyReused)
	ErrLeaseLost         = sentinelOf(KindLeaseLost)
	ErrUnavailable       = sentinelOf(KindUnavailable)
	ErrResourceExhausted = sentinelOf(KindResourceExhausted)
	ErrTooLarge          = sentinelOf(KindTooLarge)
	ErrDeadlineExceeded  = sentinelOf(KindDeadlineExceeded)
	// ErrRetryable matches every retryable kind.
	ErrRetryable = sentinelOf(KindRetryable)
)

// ErrorForStatus is the table: the Error for a status code and message. A
// FAILED_PRECONDITION whose message begins "lease lost" is KindLeaseLost.
func ErrorForStatus(code codes.Code, message string) *Error {
	kind, ok := kindByCode[code]
	if !ok {
		kind = KindOther
	}
	if code == codes.FailedPrecondition && strings.HasPrefix(message, "lease lost") {
		kind = KindLeaseLost
	}
	return &Error{Code: code, Message: message, Kind: kind}
}

// fromRPC turns what a generated stub returned into an *Error. A context
// that ended before or during the call gives CANCELLED or DEADLINE_EXCEEDED.
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return ErrorForStatus(s.Code(), s.Message())
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorForStatus(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return ErrorForStatus(codes.Canceled, err.Error())
	}
	return ErrorForStatus(codes.Unknown, err.Error())
}

// A size in the message: the sidecar's "request is N bytes, the limit is M
// bytes", tonic's "found N bytes, the limit is: M bytes", grpc's "larger
// than max (N vs. M)".
var sizeMessage = regexp.MustCompile(`bytes, the limit is|larger than max`)

// effectError: on an effect call, RESOURCE_EXHAUSTED about a size is
// TooLarge (the same call can never succeed).
func effectError(err error) error {
	var e *Error
	if errors.As(err, &e) && e.Kind == KindResourceExhausted && sizeMessage.MatchString(e.Message) {
		return &Error{Code: e.Code, Message: e.Message, Kind: KindTooLarge}
	}
	return err
}

var codeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

// CodeName is the status code's name as gRPC's specification and the other
// clients spell it: INVALID_ARGUMENT, CANCELLED, ...
func CodeName(c codes.Code) string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	if c == sentinel {
		return "ANY"
	}
	return fmt.Sprintf("CODE_%d", uint32(c))
}

func codeName(c codes.Code) string { return CodeName(c) }
