package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	oncegate "github.com/oncegate/oncegate/clients/go"
)

type consumer struct {
	cfg      config
	gate     *oncegate.Client
	session  *kgo.GroupTransactSession
	failures int // consecutive batches that met a retryable error
}

// loop polls a batch, decides it in one transaction, and commits; until ctx
// ends (SIGTERM), after which the batch in hand is finished and committed.
func (c *consumer) loop(ctx context.Context) error {
	for ctx.Err() == nil {
		fetches := c.session.PollRecords(ctx, c.cfg.batch)
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				slog.Warn("fetch error", "topic", topic, "partition", p, "err", err)
			}
		})
		records := fetches.Records()
		if len(records) == 0 {
			continue
		}
		if err := c.session.Begin(); err != nil {
			return fmt.Errorf("begin transaction: %w", err)
		}
		// Decided even when SIGTERM came meanwhile: the batch in hand is finished.
		retry := c.decide(context.WithoutCancel(ctx), records)
		if err := c.end(ctx, records, retry); err != nil {
			return err
		}
	}
	return nil
}

// decide submits each record in order; poison goes to the dead-letter topic
// inside the transaction. It stops at the first retryable error (true).
func (c *consumer) decide(ctx context.Context, records []*kgo.Record) bool {
	for _, r := range records {
		if c.cfg.maxRate > 0 {
			time.Sleep(time.Duration(float64(time.Second) / c.cfg.maxRate))
		}
		sub, err := parseBody(r.Value)
		if err != nil {
			c.deadLetter(ctx, r, "MALFORMED", err.Error())
			continue
		}
		ctx := oncegate.WithTraceparent(ctx, header(r, "traceparent"))
		d, err := c.gate.Submit(ctx, sub)
		switch oncegate.ActionFor(err) {
		case oncegate.Ack:
			c.emit(r, map[string]any{"outcome": d.Outcome, "key": d.IdempotencyKey,
				"disbursement_id": d.Disbursement.ID, "sequence": d.Disbursement.Sequence, "decided_by": d.DecidedBy})
		case oncegate.DeadLetter:
			var e *oncegate.Error
			errors.As(err, &e)
			c.deadLetter(ctx, r, oncegate.CodeName(e.Code), e.Message)
		default: // Retry, Hold: nothing of this batch may be committed
			var e *oncegate.Error
			code := "UNKNOWN"
			if errors.As(err, &e) {
				code = oncegate.CodeName(e.Code)
			}
			slog.Warn("submit failed: the batch is aborted and read again", "partition", r.Partition, "offset", r.Offset, "code", code)
			c.emit(r, map[string]any{"outcome": "ERROR", "code": code, "retryable": oncegate.ActionFor(err) == oncegate.Retry})
			return true
		}
	}
	return false
}

// end commits the batch (its offsets and dead letters) or, after a retryable
// error, aborts it; an aborted batch is read again after a backoff.
func (c *consumer) end(ctx context.Context, records []*kgo.Record, retry bool) error {
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	committed, err := c.session.End(endCtx, kgo.TransactionEndTry(!retry))
	if err != nil {
		return fmt.Errorf("end transaction: %w", err)
	}
	first, last := records[0], records[len(records)-1]
	c.line(map[string]any{"commit": committed, "records": len(records),
		"first": fmt.Sprintf("%d/%d", first.Partition, first.Offset), "last": fmt.Sprintf("%d/%d", last.Partition, last.Offset)})
	if committed {
		c.failures = 0
		return nil
	}
	if !retry {
		slog.Info("transaction aborted (rebalance): the batch is read again", "records", len(records))
		return nil
	}
	c.failures++
	delay := min(50*time.Millisecond<<min(c.failures, 7), 5*time.Second)
	select {
	case <-ctx.Done():
	case <-time.After(delay):
	}
	return nil
}

// deadLetter produces the message to the dead-letter topic in the batch's
// transaction, with why.
func (c *consumer) deadLetter(ctx context.Context, r *kgo.Record, code, reason string) {
	headers := append(append([]kgo.RecordHeader(nil), r.Headers...),
		kgo.RecordHeader{Key: "oncegate_error", Value: []byte(code)},
		kgo.RecordHeader{Key: "oncegate_error_message", Value: []byte(reason)},
		kgo.RecordHeader{Key: "oncegate_source", Value: []byte(fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset))})
	c.session.Produce(ctx, &kgo.Record{Topic: c.cfg.deadLetter, Key: r.Key, Value: r.Value, Headers: headers},
		func(_ *kgo.Record, err error) {
			if err != nil { // the transaction then aborts, and the batch is read again
				slog.Warn("dead-letter produce failed", "partition", r.Partition, "offset", r.Offset, "err", err)
			}
		})
	slog.Error("dead-lettered", "partition", r.Partition, "offset", r.Offset, "code", code, "reason", reason)
	c.emit(r, map[string]any{"outcome": "DEAD_LETTER", "code": code, "message": reason})
}

func (c *consumer) emit(r *kgo.Record, fields map[string]any) {
	id := header(r, "message_id")
	if id == "" {
		id = header(r, "event_id")
	}
	fields["partition"], fields["offset"], fields["message_id"] = r.Partition, r.Offset, id
	c.line(fields)
}

// line prints one JSON line to stdout (unbuffered: it is out before the commit).
func (c *consumer) line(fields map[string]any) {
	fields["consumer"] = c.cfg.consumer
	b, _ := json.Marshal(fields)
	os.Stdout.Write(append(b, '\n'))
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// parseBody reads the JSON body; its errors name the field, never quote the body.
func parseBody(body []byte) (oncegate.Submission, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		return oncegate.Submission{}, errors.New("body is not a JSON object")
	}
	var s oncegate.Submission
	for _, f := range []struct {
		name     string
		dst      *string
		required bool
	}{{"award_id", &s.AwardID, true}, {"submission_timestamp", &s.SubmissionTimestamp, true}, {"idempotency_key", &s.IdempotencyKey, false}} {
		raw, ok := doc[f.name]
		if !ok || string(raw) == "null" {
			if f.required {
				return s, fmt.Errorf("field %s: missing", f.name)
			}
			continue
		}
		if json.Unmarshal(raw, f.dst) != nil {
			return s, fmt.Errorf("field %s: must be a string", f.name)
		}
	}
	amount, err := parseAmount(doc["amount_cents"])
	if err != nil {
		return s, err
	}
	s.AmountCents = amount
	var payload string
	if raw, ok := doc["payload"]; ok && string(raw) != "null" && json.Unmarshal(raw, &payload) != nil {
		return s, errors.New("field payload: must be a base64 string")
	}
	if s.Payload, err = base64.StdEncoding.DecodeString(payload); err != nil {
		return s, fmt.Errorf("field payload: not base64 (%v)", err)
	}
	return s, nil
}

// parseAmount: an integer, or a string of one (as the Python examples take).
func parseAmount(raw json.RawMessage) (int64, error) {
	if raw == nil || string(raw) == "null" {
		return 0, errors.New("field amount_cents: missing")
	}
	text := string(raw)
	var quoted string
	if json.Unmarshal(raw, &quoted) == nil {
		text = quoted
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, errors.New("field amount_cents: must be an integer")
	}
	return n, nil
}
