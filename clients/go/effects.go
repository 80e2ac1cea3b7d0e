package oncegate

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/oncegate/oncegate/clients/go/oncegatev1"
)

// EffectMaxBytes is the largest effect request and response (DESIGN §9);
// more is TooLarge before anything is sent.
const EffectMaxBytes = 1024 * 1024

// Begun is what Begin answers: the lease (Acquired) or the stored response
// (Completed); exactly one is set.
type Begun struct {
	Acquired  *Acquired
	Completed *Completed
}

// Acquired: this caller holds the lease; perform the effect, then Complete
// or Release. Attempt > 1: an earlier attempt may have reached the
// provider: ask it (with the same key) before acting again.
type Acquired struct {
	LeaseToken string
	Attempt    int32
}

// Completed: the effect was done; its stored response.
type Completed struct {
	Response    []byte
	CompletedAt string
	Attempt     int32
	DecidedBy   Tier
}

func checkSize(field string, b []byte) error {
	if len(b) > EffectMaxBytes {
		return &Error{Code: codes.ResourceExhausted, Kind: KindTooLarge,
			Message: fmt.Sprintf("%s is %d bytes, the limit is %d bytes", field, len(b), EffectMaxBytes)}
	}
	return nil
}

// Begin takes the record's lease or answers its stored response. A live
// lease held elsewhere makes it wait, up to the deadline. leaseTTL 0: the
// sidecar's default (30 s).
func (c *Client) Begin(ctx context.Context, namespace, key string, request []byte, leaseTTL time.Duration) (*Begun, error) {
	if err := checkSize("request", request); err != nil {
		return nil, err
	}
	req := &pb.BeginRequest{Namespace: namespace, IdempotencyKey: key, Request: request}
	if leaseTTL > 0 {
		req.LeaseTtl = durationpb.New(leaseTTL)
	}
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	resp, err := c.effects.Begin(ctx, req)
	if err != nil {
		return nil, effectError(fromRPC(err))
	}
	switch v := resp.GetOutcome().(type) {
	case *pb.BeginResponse_Acquired:
		return &Begun{Acquired: &Acquired{LeaseToken: v.Acquired.GetLeaseToken(), Attempt: v.Acquired.GetAttempt()}}, nil
	case *pb.BeginResponse_Completed:
		cm := v.Completed
		return &Begun{Completed: &Completed{Response: cm.GetResponse(), CompletedAt: cm.GetCompletedAt(),
			Attempt: cm.GetAttempt(), DecidedBy: Tier(cm.GetDecidedBy().String())}}, nil
	}
	return nil, ErrorForStatus(codes.Unknown, "sidecar answered Begin without an outcome")
}

// Complete commits the response under the lease; returns completed_at.
// A token whose lease was taken over is ErrLeaseLost.
func (c *Client) Complete(ctx context.Context, namespace, key, leaseToken string, response []byte) (string, error) {
	if err := checkSize("response", response); err != nil {
		return "", err
	}
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	resp, err := c.effects.Complete(ctx, &pb.CompleteRequest{
		Namespace: namespace, IdempotencyKey: key, LeaseToken: leaseToken, Response: response})
	if err != nil {
		return "", effectError(fromRPC(err))
	}
	return resp.GetCompletedAt(), nil
}

// Release gives the lease back: the effect certainly did not happen.
func (c *Client) Release(ctx context.Context, namespace, key, leaseToken, reason string) error {
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	_, err := c.effects.Release(ctx, &pb.ReleaseRequest{
		Namespace: namespace, IdempotencyKey: key, LeaseToken: leaseToken, Reason: reason})
	return effectError(fromRPC(err))
}

// Effect performs an effect at most once and answers its response:
// completed before -> the stored response (perform is not called);
// acquired -> perform(ctx, attempt), then Complete with what it returned.
// An error from perform Releases the lease (the effect is taken not to have
// happened: return one only when the provider certainly did not act) and is
// returned. A panic or a crash leaves the lease to expire; the next attempt
// is told (attempt + 1).
func (c *Client) Effect(ctx context.Context, namespace, key string, request []byte,
	perform func(ctx context.Context, attempt int32) ([]byte, error)) ([]byte, error) {
	begun, err := c.Begin(ctx, namespace, key, request, 0)
	if err != nil {
		return nil, err
	}
	if begun.Completed != nil {
		return begun.Completed.Response, nil
	}
	lease := begun.Acquired
	response, err := perform(ctx, lease.Attempt)
	if err != nil {
		if rerr := c.Release(ctx, namespace, key, lease.LeaseToken, releaseReason(err)); rerr != nil {
			return nil, fmt.Errorf("%w (releasing the effect's lease failed too: %v)", err, rerr)
		}
		return nil, err
	}
	if _, err := c.Complete(ctx, namespace, key, lease.LeaseToken, response); err != nil {
		return nil, err
	}
	return response, nil
}

// releaseReason: the error's text, printable characters only, at most 256.
func releaseReason(err error) string {
	r := []rune(strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, err.Error()))
	if len(r) > 256 {
		r = r[:256]
	}
	return string(r)
}
