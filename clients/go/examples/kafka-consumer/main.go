// Command kafka-consumer is a Kafka consumer with exactly-once effect through
// the oncegate sidecar (franz-go). The loop (DESIGN §1):
//
//	poll -> Submit -> commit the offset only after CLAIMED or DUPLICATE
//
// How it keeps to it:
//
//   - One consumer group, read_committed (only committed transactions are
//     read, so the oncegate relay's Kafka transactions come through exactly
//     once), no auto-commit.
//   - Each polled batch is one Kafka transaction (franz-go's
//     GroupTransactSession): the batch's offsets and its dead letters commit
//     together, after every message of the batch was decided. Killed before
//     the commit, the batch is read again (here or by the partition's next
//     owner) and the sidecar answers DUPLICATE.
//   - A message error (malformed body, InvalidSubmission, KeyReused): retrying
//     can never succeed. The message goes to the dead-letter topic (its key,
//     value and headers plus oncegate_error, oncegate_error_message,
//     oncegate_source) in the batch's transaction, so a read_committed reader
//     of the dead-letter topic sees each poison message once.
//   - A retryable error (sidecar or its store down, overloaded, deadline):
//     the transaction is aborted (nothing committed, no dead letter), the
//     group's positions go back to the last commit, and the consumer backs
//     off before polling again.
//   - SIGTERM/SIGINT: finish the batch in hand, commit it, leave the group,
//     exit 0.
//
// Messages: a JSON object {award_id, submission_timestamp, amount_cents,
// payload (base64), idempotency_key (optional)}, the body of the Python
// examples. Each handled message is printed to stdout as one JSON line
// before its offset is committed (and one line per commit); logs go to
// stderr. Payloads are never logged.
//
//	kafka-consumer --bootstrap-servers kafka:9092 --topic grants --group grants-workers \
//	    --dead-letter-topic grants.dead --consumer "$POD_NAME" --target 127.0.0.1:50051
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	oncegate "github.com/oncegate/oncegate/clients/go"
)

type config struct {
	bootstrap, topic, group, deadLetter, target, consumer string
	timeout, sessionTimeout                               time.Duration
	batch                                                 int
	maxRate                                               float64
}

func parseFlags() config {
	host, _ := os.Hostname()
	var c config
	flag.StringVar(&c.bootstrap, "bootstrap-servers", envOr("KAFKA_BOOTSTRAP", "127.0.0.1:9092"), "Kafka brokers, comma separated")
	flag.StringVar(&c.topic, "topic", "", "topic to consume (required)")
	flag.StringVar(&c.group, "group", "", "consumer group id (required)")
	flag.StringVar(&c.deadLetter, "dead-letter-topic", "", "dead-letter topic (default <topic>.dead)")
	flag.StringVar(&c.target, "target", envOr("ONCEGATE_TARGET", oncegate.DefaultTarget), "oncegate sidecar gRPC address")
	flag.StringVar(&c.consumer, "consumer", fmt.Sprintf("%s-%d", host, os.Getpid()),
		"member name: client id, and the transactional id <group>.consumer.<name> (keep it stable per replica)")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Second, "deadline per Submit")
	flag.DurationVar(&c.sessionTimeout, "session-timeout", 10*time.Second, "group session timeout (a killed member's partitions move after it)")
	flag.IntVar(&c.batch, "batch", 100, "most messages per poll, and so per transaction")
	flag.Float64Var(&c.maxRate, "max-rate", 0, "messages per second (0: unlimited)")
	flag.Parse()
	if c.topic == "" || c.group == "" || c.batch < 1 {
		fmt.Fprintln(os.Stderr, "kafka-consumer: --topic and --group are required, --batch at least 1")
		os.Exit(64)
	}
	if c.deadLetter == "" {
		c.deadLetter = c.topic + ".dead"
	}
	return c
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func main() {
	cfg := parseFlags()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		slog.Error("consumer failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	gate, err := oncegate.Dial(cfg.target, oncegate.WithTimeout(cfg.timeout))
	if err != nil {
		return err
	}
	defer gate.Close()
	session, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(strings.Split(cfg.bootstrap, ",")...),
		kgo.ClientID(cfg.consumer),
		kgo.TransactionalID(cfg.group+".consumer."+cfg.consumer),
		kgo.TransactionTimeout(30*time.Second),
		kgo.ConsumerGroup(cfg.group),
		kgo.ConsumeTopics(cfg.topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(cfg.sessionTimeout),
		kgo.HeartbeatInterval(max(cfg.sessionTimeout/4, 100*time.Millisecond)),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, p map[string][]int32) {
			slog.Info("assigned", "partitions", p[cfg.topic])
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, p map[string][]int32) {
			slog.Info("revoked", "partitions", p[cfg.topic])
		}),
	)
	if err != nil {
		return err
	}
	defer session.Close() // leaves the group: its partitions move at once
	c := &consumer{cfg: cfg, gate: gate, session: session}
	slog.Info("consuming", "topic", cfg.topic, "group", cfg.group)
	return c.loop(ctx)
}
