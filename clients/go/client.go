// Package oncegate is the Go client of the oncegate sidecar
// (oncegate.v1.Gate and oncegate.v1.Effects): exactly-once effect for a
// message consumer over an at-least-once broker.
//
// The consumer's rule (DESIGN §1): ack the broker only after Submit returned
// a Decision (CLAIMED or DUPLICATE). On an error do not ack, unless the error
// says the message is poison: then dead-letter it and ack. ActionFor(err)
// says which:
//
//	d, err := gate.Submit(ctx, oncegate.Submission{AwardID: a, SubmissionTimestamp: ts, Payload: p, AmountCents: c})
//	switch oncegate.ActionFor(err) {
//	case oncegate.Ack:        commit(msg)                  // d.Outcome is CLAIMED or DUPLICATE
//	case oncegate.DeadLetter: deadLetter(msg); commit(msg) // nothing was written
//	default:                  // Retry or Hold: no commit; the message is read again
//	}
//
// The generated stubs are in the oncegatev1 package.
package oncegate

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	pb "github.com/oncegate/oncegate/clients/go/oncegatev1"
)

// DefaultTarget is the sidecar's default listen address (loopback: it is
// reached only from its own pod).
const DefaultTarget = "127.0.0.1:50051"

// DefaultTimeout is the deadline of a call whose context has none. A
// consumer should always have one: an expired call is DeadlineExceeded
// (retryable), it never hangs the loop.
const DefaultTimeout = 10 * time.Second

// Client calls one sidecar. It is safe for concurrent use.
type Client struct {
	conn    *grpc.ClientConn // nil when the caller gave its own connection
	gate    pb.GateClient
	effects pb.EffectsClient
	health  healthpb.HealthClient
	timeout time.Duration
}

// Option configures Dial and New.
type Option func(*options)

type options struct {
	timeout  time.Duration
	creds    credentials.TransportCredentials
	dialOpts []grpc.DialOption
}

// WithTimeout sets the deadline of calls whose context has none (0: none).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithTransportCredentials turns TLS on (Dial only).
func WithTransportCredentials(c credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = c }
}

// WithDialOptions adds grpc dial options (Dial only).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

func collect(opts []Option) options {
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Dial connects to a sidecar: "host:port", "http://host:port" (plaintext)
// or "https://host:port" (TLS with the system roots unless
// WithTransportCredentials gives others). The connection is made lazily;
// Close releases it.
func Dial(target string, opts ...Option) (*Client, error) {
	o := collect(opts)
	creds := o.creds
	switch {
	case strings.HasPrefix(target, "http://"):
		target = strings.TrimPrefix(target, "http://")
	case strings.HasPrefix(target, "https://"):
		target = strings.TrimPrefix(target, "https://")
		if creds == nil {
			creds = credentials.NewClientTLSFromCert(nil, "")
		}
	}
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	dialOpts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, o.dialOpts...)
	conn, err := grpc.NewClient(strings.TrimSuffix(target, "/"), dialOpts...)
	if err != nil {
		return nil, err
	}
	c := New(conn, opts...)
	c.conn = conn
	return c, nil
}

// New uses a connection of the caller's (Close leaves it open).
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	o := collect(opts)
	return &Client{
		gate:    pb.NewGateClient(conn),
		effects: pb.NewEffectsClient(conn),
		health:  healthpb.NewHealthClient(conn),
		timeout: o.timeout,
	}
}

// Close closes the connection Dial made.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Stub is the generated Gate client underneath, for what this layer does
// not wrap.
func (c *Client) Stub() pb.GateClient { return c.gate }

// EffectsStub is the generated Effects client underneath.
func (c *Client) EffectsStub() pb.EffectsClient { return c.effects }

// deadline gives ctx the client's default timeout when it has no deadline.
func (c *Client) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || c.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.timeout)
}

// WithTraceparent returns a context whose calls carry the W3C trace context
// (say, the traceparent header of the broker message in hand): the
// sidecar's span continues it and the outbox event carries it on.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
}

// Submit decides one delivery: CLAIMED (first time, effect committed) or
// DUPLICATE (the stored original result). Errors are *Error.
func (c *Client) Submit(ctx context.Context, s Submission) (*Decision, error) {
	if msg := s.utf8Problem(); msg != "" {
		return nil, invalid(msg)
	}
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	d, err := c.gate.Submit(ctx, s.proto())
	if err != nil {
		return nil, fromRPC(err)
	}
	return decisionOf(d), nil
}

// SubmitBatch decides many deliveries: one result per item, in order, each
// a Decision or an *Error (per item, not returned as the call's error). The
// call's own failure is the returned error.
func (c *Client) SubmitBatch(ctx context.Context, subs []Submission) ([]BatchResult, error) {
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	req := &pb.SubmitBatchRequest{Submissions: make([]*pb.Submission, len(subs))}
	for i, s := range subs {
		if msg := s.utf8Problem(); msg != "" {
			return nil, invalid(fmt.Sprintf("submission %d: %s", i, msg))
		}
		req.Submissions[i] = s.proto()
	}
	resp, err := c.gate.SubmitBatch(ctx, req)
	if err != nil {
		return nil, fromRPC(err)
	}
	out := make([]BatchResult, len(resp.GetResults()))
	for i, r := range resp.GetResults() {
		out[i] = batchResult(r)
	}
	return out, nil
}

// Lookup reads the stored result for a key (outcome DUPLICATE); nil, nil
// when there is none.
func (c *Client) Lookup(ctx context.Context, idempotencyKey string) (*Decision, error) {
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	resp, err := c.gate.Lookup(ctx, &pb.LookupRequest{IdempotencyKey: idempotencyKey})
	if err != nil {
		return nil, fromRPC(err)
	}
	if !resp.GetFound() {
		return nil, nil
	}
	return decisionOf(resp.GetDecision()), nil
}

// Health is grpc.health.v1's Check: "" is the whole server,
// "oncegate.v1.Gate" the Gate service. NOT_SERVING while draining.
func (c *Client) Health(ctx context.Context, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := c.deadline(ctx)
	defer cancel()
	resp, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN, fromRPC(err)
	}
	return resp.GetStatus(), nil
}
