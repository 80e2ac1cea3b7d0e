package oncegate_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	oncegate "github.com/oncegate/oncegate/clients/go"
	"github.com/oncegate/oncegate/clients/go/internal/testsidecar"
	pb "github.com/oncegate/oncegate/clients/go/oncegatev1"
)

type rejection struct {
	Name            string         `json:"name"`
	RPC             string         `json:"rpc"`
	Request         map[string]any `json:"request"`
	Code            string         `json:"code"`
	Field           string         `json:"field"`
	Message         string         `json:"message"`
	MaxPayloadBytes int            `json:"max_payload_bytes"`
}

func rejections(t *testing.T) []rejection {
	t.Helper()
	raw, err := os.ReadFile(vectorsPath("rejections.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rejections []rejection `json:"rejections"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("rejections.json: %v", err)
	}
	return doc.Rejections
}

func str(req map[string]any, name string) string { s, _ := req[name].(string); return s }

// body is <name>_b64 decoded and repeated <name>_repeat times.
func body(t *testing.T, req map[string]any, name string) []byte {
	b, err := base64.StdEncoding.DecodeString(str(req, name+"_b64"))
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := req[name+"_repeat"].(float64); ok {
		b = bytes.Repeat(b, int(n))
	}
	return b
}

func submissionOf(t *testing.T, req map[string]any) (oncegate.Submission, bool) {
	amount, err := strconv.ParseInt(str(req, "amount_cents"), 10, 64)
	if err != nil {
		t.Fatalf("amount_cents %q", str(req, "amount_cents"))
	}
	key, hasKey := req["idempotency_key"].(string)
	s := oncegate.Submission{AwardID: str(req, "award_id"), SubmissionTimestamp: str(req, "submission_timestamp"),
		Payload: body(t, req, "payload"), AmountCents: amount, IdempotencyKey: key}
	// An empty producer key cannot be expressed: "" means "derive it".
	return s, !(hasKey && key == "")
}

// Every Submit vector: Validate gives the sidecar's code and message.
func TestValidateAgreesWithTheRejectionVectors(t *testing.T) {
	checked, inexpressible := 0, 0
	for _, v := range rejections(t) {
		if v.RPC != "Submit" {
			continue
		}
		s, ok := submissionOf(t, v.Request)
		if !ok {
			inexpressible++
			continue
		}
		err := oncegate.Validate(s, v.MaxPayloadBytes)
		if err == nil || oncegate.CodeName(err.Code) != v.Code || err.Message != v.Message {
			t.Errorf("%s: Validate gave %v, the vector says %s %q", v.Name, err, v.Code, v.Message)
		}
		checked++
	}
	for _, v := range keyVectorsFull(t) {
		if err := oncegate.Validate(v, 0); err != nil {
			t.Errorf("valid vector award %q refused: %v", v.AwardID, err)
		}
	}
	fmt.Printf("parity: Validate == %d Submit rejection vectors (%d with an empty producer key, which the Go type cannot express)\n",
		checked, inexpressible)
}

// Every rejection vector, sent to the real sidecar through the client: the
// error it returns has the vector's code and message and is poison.
func TestTheSidecarRefusesEveryRejectionVectorThroughTheClient(t *testing.T) {
	gate := dial(t, testsidecar.Start(t, t.TempDir()))
	viaClient, viaStub := 0, 0
	for _, v := range rejections(t) {
		err, stub := send(t, gate, v)
		var e *oncegate.Error
		if !errors.As(err, &e) || oncegate.CodeName(e.Code) != v.Code || e.Message != v.Message {
			t.Errorf("%s (%s): got %v, the vector says %s %q", v.Name, v.RPC, err, v.Code, v.Message)
			continue
		}
		if v.Code == "INVALID_ARGUMENT" && oncegate.ActionFor(err) != oncegate.DeadLetter {
			t.Errorf("%s: INVALID_ARGUMENT should be dead-lettered, got %v", v.Name, oncegate.ActionFor(err))
		}
		if stub {
			viaStub++
		} else {
			viaClient++
		}
	}
	fmt.Printf("parity: the sidecar refused %d rejection vectors with their code and message (%d through the client, %d through the generated stub)\n",
		viaClient+viaStub, viaClient, viaStub)
}

// send makes the vector's call; stub: through the generated stub, because
// the client's types cannot express the request (an empty producer key, a
// lease_ttl that is zero or not normalised).
func send(t *testing.T, gate *oncegate.Client, v rejection) (error, bool) {
	ctx := context.Background()
	r := v.Request
	switch v.RPC {
	case "Submit":
		s, ok := submissionOf(t, r)
		if !ok {
			m := &pb.Submission{AwardId: s.AwardID, SubmissionTimestamp: s.SubmissionTimestamp, Payload: s.Payload,
				AmountCents: s.AmountCents, IdempotencyKey: new(string)}
			_, err := gate.Stub().Submit(ctx, m)
			return fromStatus(err), true
		}
		_, err := gate.Submit(ctx, s)
		return err, false
	case "SubmitBatch":
		item, _ := submissionOf(t, r["submission"].(map[string]any))
		subs := make([]oncegate.Submission, int(r["count"].(float64)))
		for i := range subs {
			subs[i] = item
		}
		_, err := gate.SubmitBatch(ctx, subs)
		return err, false
	case "Lookup":
		_, err := gate.Lookup(ctx, str(r, "idempotency_key"))
		return err, false
	case "Begin":
		return begin(t, gate, r)
	case "Complete":
		_, err := gate.Complete(ctx, str(r, "namespace"), str(r, "idempotency_key"), str(r, "lease_token"), body(t, r, "response"))
		return err, false
	case "Release":
		return gate.Release(ctx, str(r, "namespace"), str(r, "idempotency_key"), str(r, "lease_token"), str(r, "reason")), false
	}
	t.Fatalf("%s: unknown rpc %s", v.Name, v.RPC)
	return nil, false
}

func begin(t *testing.T, gate *oncegate.Client, r map[string]any) (error, bool) {
	ctx := context.Background()
	ttl, hasTTL := r["lease_ttl"].(map[string]any)
	if !hasTTL {
		_, err := gate.Begin(ctx, str(r, "namespace"), str(r, "idempotency_key"), body(t, r, "request"), 0)
		return err, false
	}
	secs, _ := strconv.ParseInt(ttl["seconds"].(string), 10, 64)
	nanos := int32(ttl["nanos"].(float64))
	d := &durationpb.Duration{Seconds: secs, Nanos: nanos}
	if d.CheckValid() == nil && d.AsDuration() > 0 {
		_, err := gate.Begin(ctx, str(r, "namespace"), str(r, "idempotency_key"), body(t, r, "request"), d.AsDuration())
		return err, false
	}
	_, err := gate.EffectsStub().Begin(ctx, &pb.BeginRequest{Namespace: str(r, "namespace"),
		IdempotencyKey: str(r, "idempotency_key"), Request: body(t, r, "request"), LeaseTtl: d})
	return fromStatus(err), true
}

func fromStatus(err error) error {
	s, _ := status.FromError(err)
	if err == nil {
		return nil
	}
	return oncegate.ErrorForStatus(s.Code(), s.Message())
}

// The key vectors: accepted by Validate, and by the sidecar with the same key.
func keyVectorsFull(t *testing.T) []oncegate.Submission {
	raw, err := os.ReadFile(vectorsPath("keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var out []oncegate.Submission
	for _, k := range doc.Keys {
		s, _ := submissionOf(t, k)
		out = append(out, s)
	}
	return out
}
