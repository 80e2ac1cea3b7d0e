"""Summarises a scripts/bench run: medians per figure, ratios per round
(yardstick and sidecar measured back to back in the same round) and their
medians, written as BASE.json and BASE.md and printed."""

import json
import statistics
import sys
from collections import defaultdict

raw_path, machine_path, base = sys.argv[1:4]
rows = [json.loads(line) for line in open(raw_path) if line.strip()]
machine = json.load(open(machine_path))

by = defaultdict(dict)  # name -> round -> result
for r in rows:
    by[r["name"]][r["round"]] = r["r"]


LIMITS = ("limit_c2", "limit_c4", "limit_c8")


def figure(name, rnd):
    if name == "limit_best":
        vals = [figure(n, rnd) for n in LIMITS]
        vals = [v for v in vals if v is not None]
        return max(vals) if vals else None
    r = by[name].get(rnd)
    if r is None:
        return None
    if "deliveries_per_s" in r and "tps" in r:
        return r["deliveries_per_s"]
    if "tps" in r:
        return r["tps"]
    if name.startswith(("fresh", "growth", "lanes")):
        return r["claims_per_s"]
    if name.startswith(("dup", "spool", "audit_written", "audit_held")):
        return r["duplicates_per_s"]
    return r["deliveries_per_s"]


def p99(name, rnd, cls="ALL"):
    r = by[name].get(rnd)
    if r is None or "latency" not in r:
        return None
    return r["latency"].get(cls, {}).get("p99_ms")


def steal(name, rnd):
    """The hypervisor's share of the machine's CPU during the measurement."""
    return by[name].get(rnd, {}).get("steal_share")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


rounds = sorted({r["round"] for r in rows if r["round"] > 0})
FIGURES = [
    ("fresh_gc", "sidecar fresh claims/s, 64 clients, group commit on"),
    ("fresh_nogc", "sidecar fresh claims/s, 64 clients, group commit off (max batch 1)"),
    ("peer_fresh", "the peer: pgbench, the seeds' plain transaction on a plain schema, 64 clients, tps"),
    ("limit_c2", "the limit: pgbench, oncegate's set-based statements, 128 per transaction, 2 clients, deliveries/s"),
    ("limit_c4", "the limit, 4 clients, deliveries/s"),
    ("limit_c8", "the limit, 8 clients, deliveries/s"),
    ("pgbench_fresh", "same-schema pgbench: oncegate's per-delivery statements on oncegate's schema, 64 clients, tps"),
    ("dup_l1_64", "sidecar L1 duplicates/s, 64 clients"),
    ("echo_64", "bare tonic echo calls/s, 64 clients"),
    ("dup_l1_16", "sidecar L1 duplicates/s, 16 clients"),
    ("echo_16", "bare tonic echo calls/s, 16 clients"),
    ("mix_32", "sidecar deliveries/s, 30 % redeliveries, 32 clients"),
    ("peer_mix", "the peer, 70 % fresh / 30 % duplicate (audited), 32 clients, tps"),
    ("pgbench_mix", "same-schema pgbench 70 % fresh / 30 % duplicate, 32 clients, tps"),
    ("dup_l1_64_log_info", "sidecar L1 duplicates/s, 64 clients, default log level (info)"),
    ("dup_l1_64_log_warn", "sidecar L1 duplicates/s, 64 clients, RUST_LOG=warn (no INFO line)"),
    ("effects_64", "Effects API operations/s (Begin+Complete of a fresh key, or a Begin answered stored; 30 %), 64 clients"),
    ("seal_on", "sidecar fresh claims/s, 64 clients, audit sealed every second"),
    ("seal_off", "sidecar fresh claims/s, 64 clients, sealing off"),
    ("kafka_on", "sidecar fresh claims/s, 64 clients, relay publishing to Kafka"),
    ("kafka_off", "sidecar fresh claims/s, 64 clients, no sink"),
    ("kafka_publish", "relay publish rate into Kafka, events/s (a backlog drained, start-up included)"),
    ("kafka_publish_p1", "relay publish rate into Kafka, events/s, a backlog drained by 1 relay process (started and holding its slots first)"),
    ("kafka_publish_p2", "relay publish rate into Kafka, events/s, 2 relay processes"),
    ("kafka_publish_p3", "relay publish rate into Kafka, events/s, 3 relay processes"),
    ("kafka_on_left", "events the relay left waiting when the claims of kafka_on stopped"),
    ("before_kafka_on", "the other binary (--kafka-against): fresh claims/s, relay publishing to Kafka"),
    ("before_kafka_off", "the other binary: fresh claims/s, no sink"),
    ("before_kafka_publish_p1", "the other binary: publish rate into Kafka, 1 relay process"),
    ("before_kafka_publish_p2", "the other binary: publish rate into Kafka, 2 relay processes"),
    ("before_kafka_publish_p3", "the other binary: publish rate into Kafka, 3 relay processes"),
    ("before_kafka_on_left", "the other binary: events left waiting when the claims of kafka_on stopped"),
    ("spool_on", "sidecar L1 duplicates/s, 64 clients, audit spool on (ONCEGATE_AUDIT_SPOOL_DIR)"),
    ("spool_off", "sidecar L1 duplicates/s, 64 clients, audit spool off"),
    ("audit_written", "sidecar L1 duplicates/s, 64 clients, audit rows written (as always)"),
    ("audit_held", "sidecar L1 duplicates/s, 64 clients, audit rows held in memory through the measurement"),
    ("audit_echo", "bare tonic echo calls/s, 64 clients (beside the audit-cost pair)"),
    ("audit_written_16", "sidecar L1 duplicates/s, 16 clients, audit rows written (as always)"),
    ("audit_held_16", "sidecar L1 duplicates/s, 16 clients, audit rows held in memory through the measurement"),
    ("audit_echo_16", "bare tonic echo calls/s, 16 clients (beside the audit-cost pair)"),
]
RATIOS = [
    ("fresh (group commit) / the peer", "fresh_gc", "peer_fresh", figure, ">= 2.5", lambda x: x >= 2.5),
    ("fresh (group commit) / the limit (best)", "fresh_gc", "limit_best", figure, ">= 0.65", lambda x: x >= 0.65),
    ("mix / the peer's mix", "mix_32", "peer_mix", figure, ">= 2.5", lambda x: x >= 2.5),
    ("L1 duplicates / echo (64 clients)", "dup_l1_64", "echo_64", figure, ">= 0.85", lambda x: x >= 0.85),
    ("L1 duplicate p99 / echo p99 (16 clients)", "dup_l1_16", "echo_16", p99, "<= 1.3", lambda x: x <= 1.3),
    ("fresh (no group commit) / the peer", "fresh_nogc", "peer_fresh", figure, "(one commit per delivery)", lambda x: None),
    ("fresh (group commit) / same-schema pgbench", "fresh_gc", "pgbench_fresh", figure, "(same schema, not a user's yardstick)", lambda x: None),
    ("mix / same-schema pgbench mix", "mix_32", "pgbench_mix", figure, "(same schema, not a user's yardstick)", lambda x: None),
    ("L1 duplicates, info / warn log level", "dup_l1_64_log_info", "dup_l1_64_log_warn", figure, "(cost of the INFO line)", lambda x: None),
    ("fresh claims, sealing every second / sealing off", "seal_on", "seal_off", figure, "(cost of sealing)", lambda x: None),
    ("fresh claims, Kafka sink on / off", "kafka_on", "kafka_off", figure, ">= 0.90 (cost of the Kafka relay)", lambda x: x >= 0.9),
    ("relay into Kafka, 1 relay / fresh claims (no sink)", "kafka_publish_p1", "kafka_off", figure, ">= 1.0 (keeps up)", lambda x: x >= 1.0),
    ("relay into Kafka, 2 relays / 1 relay", "kafka_publish_p2", "kafka_publish_p1", figure, "> 1 (grows with pods)", lambda x: x > 1.0),
    ("relay into Kafka, 3 relays / 1 relay", "kafka_publish_p3", "kafka_publish_p1", figure, "> 1 (grows with pods)", lambda x: x > 1.0),
    ("other binary: fresh claims, Kafka sink on / off", "before_kafka_on", "before_kafka_off", figure, "", lambda x: None),
    ("other binary: relay into Kafka, 1 relay / fresh claims (no sink)", "before_kafka_publish_p1", "before_kafka_off", figure, "", lambda x: None),
    ("other binary: relay into Kafka, 2 relays / 1 relay", "before_kafka_publish_p2", "before_kafka_publish_p1", figure, "", lambda x: None),
    ("other binary: relay into Kafka, 3 relays / 1 relay", "before_kafka_publish_p3", "before_kafka_publish_p1", figure, "", lambda x: None),
    ("relay into Kafka, 1 relay: this binary / the other", "kafka_publish_p1", "before_kafka_publish_p1", figure, "", lambda x: None),
    ("L1 duplicates, audit spool on / off", "spool_on", "spool_off", figure, "(cost of the spool)", lambda x: None),
    ("L1 duplicates / echo, audit rows written", "audit_written", "audit_echo", figure, "(the audit-cost pair)", lambda x: None),
    ("L1 duplicates / echo, audit rows held in memory", "audit_held", "audit_echo", figure, "(without the audit rows' Postgres work)", lambda x: None),
    ("L1 duplicate p99 / echo p99 (16 clients), audit rows written", "audit_written_16", "audit_echo_16", p99, "(the audit-cost pair)", lambda x: None),
    ("L1 duplicate p99 / echo p99 (16 clients), audit rows held in memory", "audit_held_16", "audit_echo_16", p99, "(without the audit rows' Postgres work)", lambda x: None),
]

for name in sorted((n for n in by if n.startswith("lanes_")), key=lambda n: int(n.split("_")[1])):
    lanes = name.split("_")[1]
    FIGURES.append((name, f"sidecar fresh claims/s, 64 clients, {lanes} group-commit lane(s)"))

summary = {"machine": machine, "figures": {}, "ratios": {}, "raw": rows}
for name, desc in FIGURES:
    vals = [figure(name, r) for r in rounds]
    p99s = [p99(name, r) for r in rounds]
    if not any(v is not None for v in vals):
        continue
    summary["figures"][name] = {
        "description": desc,
        "per_round": vals,
        "median": med(vals),
        "p99_ms_per_round": p99s,
        "p99_ms_median": med(p99s),
        "steal_share_per_round": [steal(name, r) for r in rounds],
    }
for label, a, b, f, target, ok in RATIOS:
    if not by.get(a):
        continue
    per = []
    for r in rounds:
        x, y = f(a, r), f(b, r)
        per.append(x / y if x is not None and y else None)
    m = med(per)
    summary["ratios"][label] = {
        "per_round": per,
        "median": m,
        "target": target,
        "met": None if m is None else ok(m),
    }

def cost(name, key):
    return med([by[name].get(r, {}).get(key) for r in rounds])


COSTS = [
    ("sidecar CPU per fresh claim (64 clients)", "fresh_gc", "sidecar_cpu_us_per_op", "<= 60", lambda x: x <= 60),
    ("Postgres CPU per fresh claim (sidecar, 64 clients)", "fresh_gc", "postgres_cpu_us_per_op", "", None),
    ("Postgres CPU per delivery (the peer, 64 clients)", "peer_fresh", "postgres_cpu_us_per_op", "", None),
    ("Postgres CPU per delivery (the limit, 4 clients)", "limit_c4", "postgres_cpu_us_per_op", "", None),
    ("sidecar CPU per L1 duplicate (64 clients)", "dup_l1_64", "sidecar_cpu_us_per_op", "<= 20", lambda x: x <= 20),
    ("sidecar CPU per delivery, 30 % redeliveries (32 clients)", "mix_32", "sidecar_cpu_us_per_op", "", None),
    ("sidecar CPU per effect operation (64 clients, 30 % stored answers)", "effects_64", "sidecar_cpu_us_per_op", "", None),
    ("Postgres CPU per effect operation", "effects_64", "postgres_cpu_us_per_op", "", None),
    ("sidecar CPU per fresh claim, sealing every second", "seal_on", "sidecar_cpu_us_per_op", "", None),
    ("sidecar CPU per fresh claim, sealing off", "seal_off", "sidecar_cpu_us_per_op", "", None),
    ("Postgres CPU per fresh claim, sealing every second", "seal_on", "postgres_cpu_us_per_op", "", None),
    ("Postgres CPU per fresh claim, sealing off", "seal_off", "postgres_cpu_us_per_op", "", None),
    ("sidecar CPU per fresh claim, Kafka sink on", "kafka_on", "sidecar_cpu_us_per_op", "", None),
    ("sidecar CPU per fresh claim, no sink", "kafka_off", "sidecar_cpu_us_per_op", "", None),
    ("relay CPU per event into Kafka, 1 relay", "kafka_publish_p1", "relay_cpu_us_per_op", "", None),
    ("Postgres CPU per event relayed, 1 relay", "kafka_publish_p1", "postgres_cpu_us_per_op", "", None),
    ("Kafka broker CPU per event relayed, 1 relay", "kafka_publish_p1", "broker_cpu_us_per_op", "", None),
    ("relay CPU per event into Kafka, 3 relays", "kafka_publish_p3", "relay_cpu_us_per_op", "", None),
    ("other binary: relay CPU per event into Kafka, 1 relay", "before_kafka_publish_p1", "relay_cpu_us_per_op", "", None),
    ("other binary: Postgres CPU per event relayed, 1 relay", "before_kafka_publish_p1", "postgres_cpu_us_per_op", "", None),
    ("other binary: Kafka broker CPU per event relayed, 1 relay", "before_kafka_publish_p1", "broker_cpu_us_per_op", "", None),
    ("sidecar CPU per L1 duplicate, audit spool on", "spool_on", "sidecar_cpu_us_per_op", "", None),
    ("sidecar CPU per L1 duplicate, audit spool off", "spool_off", "sidecar_cpu_us_per_op", "", None),
    ("Postgres CPU per L1 duplicate, audit rows written", "audit_written", "postgres_cpu_us_per_op", "", None),
    ("Postgres CPU per L1 duplicate, audit rows held", "audit_held", "postgres_cpu_us_per_op", "", None),
    ("sidecar CPU per L1 duplicate, audit rows written", "audit_written", "sidecar_cpu_us_per_op", "", None),
    ("sidecar CPU per L1 duplicate, audit rows held", "audit_held", "sidecar_cpu_us_per_op", "", None),
]
for name in sorted((n for n in by if n.startswith("lanes_")), key=lambda n: int(n.split("_")[1])):
    lanes = name.split("_")[1]
    COSTS.append((f"sidecar CPU per fresh claim, {lanes} lane(s)", name, "sidecar_cpu_us_per_op", "", None))
    COSTS.append((f"Postgres CPU per fresh claim, {lanes} lane(s)", name, "postgres_cpu_us_per_op", "", None))
summary["costs"] = {}
for label, name, key, target, ok in COSTS:
    if not by.get(name):
        continue
    m = cost(name, key)
    summary["costs"][label] = {
        "per_round_us": [by[name].get(r, {}).get(key) for r in rounds],
        "median_us": m,
        "target": target,
        "met": None if (m is None or ok is None) else ok(m),
    }

extra = []
mem = by.get("memory", {}).get(0)
if mem:
    budget = mem["l1_budget_bytes"] / 1048576
    hwm = mem["vmhwm_kib"] / 1024
    summary["memory"] = {
        "distinct_keys": mem["deliveries"],
        "claims_per_s": mem["claims_per_s"],
        "vmhwm_mib": hwm,
        "vmrss_end_mib": mem["vmrss_kib"] / 1024,
        "l1_budget_mib": budget,
        "limit_mib": budget + 64,
        "met": hwm <= budget + 64,
        "ledger_ok": mem["ledger_ok"],
    }
if "growth_full" in by:
    e = [p99("growth_empty", r) for r in rounds]
    f_ = [p99("growth_full", r) for r in rounds]
    per = [x / y if x and y else None for x, y in zip(f_, e)]
    fill = by["growth_fill"][0]
    summary["growth"] = {
        "existing_claims": fill["claims"],
        "fill_seconds": fill["seconds"],
        "p99_ms_empty_per_round": e,
        "p99_ms_full_per_round": f_,
        "claims_per_s_empty": med([figure("growth_empty", r) for r in rounds]),
        "claims_per_s_full": med([figure("growth_full", r) for r in rounds]),
        "ratio_per_round": per,
        "ratio_median": med(per),
        "target": "<= 1.5",
        "met": None if med(per) is None else med(per) <= 1.5,
    }

INSTRUCTIONS = [
    ("in_fresh", "sidecar, per fresh claim"),
    ("in_dup_l1", "sidecar, per L1 duplicate"),
    ("in_echo", "bare tonic echo, per call (the transport's floor)"),
]
if any(name in by for name, _ in INSTRUCTIONS):
    summary["instructions"] = {
        name: dict(by[name][0], description=desc) for name, desc in INSTRUCTIONS if name in by
    }

# The fixed-rate report (--rate): per figure, medians over the rounds of the
# process's millicores, RSS, latency and the latency added over the echo
# measured in the same round, and the millicores over the echo's.
RATE_FIGURES = [
    ("rate_echo", "bare gRPC echo (the yardstick)"),
    ("rate_dup_l1", "L1 duplicates"),
    ("rate_fresh", "fresh claims"),
    ("rate_mix", "30 % redeliveries"),
]


def rate_row(name, desc):
    rs = by.get(name, {})
    if not rs:
        return None
    echo = by.get("rate_echo", {})

    def q(r, k):
        return r["latency"].get("ALL", {}).get(k)

    per = {}
    for rnd, r in sorted(rs.items()):
        e = echo.get(rnd)
        per[rnd] = {
            "millicores": r["process"]["millicores"],
            "cpu_us_per_op": r["process"]["cpu_us_per_op"],
            "rss_mib": r["process"]["rss_mib"],
            "switches_per_op": r["process"].get("switches_per_op"),
            "deliveries_per_s": r["deliveries_per_s"],
            "p50_ms": q(r, "p50_ms"),
            "p90_ms": q(r, "p90_ms"),
            "p99_ms": q(r, "p99_ms"),
            "postgres_cpu_us_per_claim": r.get("postgres_cpu_us_per_claim"),
            "load1": r.get("load1"),
            "errors": r.get("errors"),
            "ledger_ok": r.get("ledger_ok"),
            "mcpu_over_echo": None if e is None else r["process"]["millicores"] / max(e["process"]["millicores"], 1e-9),
            **{
                f"added_{k}": None if e is None or q(r, k) is None else q(r, k) - q(e, k)
                for k in ("p50_ms", "p90_ms", "p99_ms")
            },
        }
    keys = next(iter(per.values())).keys()
    return {
        "description": desc,
        "per_round": per,
        "median": {
            k: med([v[k] for v in per.values()]) for k in keys if k not in ("errors", "ledger_ok")
        },
    }


if any(n in by for n, _ in RATE_FIGURES):
    summary["rate"] = {"offered_per_s": machine.get("rate"), "seconds": machine.get("rate_seconds")}
    for prefix in ("", "before_"):
        for name, desc in RATE_FIGURES:
            if prefix and name == "rate_echo":
                continue
            row = rate_row(prefix + name, desc)
            if row:
                summary["rate"][prefix + name] = row

steals = [r["r"]["steal_share"] for r in rows if "steal_share" in r["r"]]
if steals:
    summary["steal_share"] = {"median": med(steals), "max": max(steals)}

json.dump(summary, open(base + ".json", "w"), indent=2)


def fmt(x, nd=0):
    if x is None:
        return "-"
    return f"{x:,.{nd}f}"


md = []
m = machine
md.append(f"# oncegate benchmark, {m['date_utc']}, {m['host']}\n")
md.append(
    f"- machine: {m['nproc']} cores ({m['cpu']}), {m['memory_mib']} MiB, Linux {m['kernel']}\n"
    f"- {m['postgres']}\n- Postgres settings: {m['postgres_settings']}\n"
    f"- git {m['git_rev']}; Redis L2: {m['redis']}; {m['sidecar_env']}\n"
    f"- {m['rounds']} interleaved rounds, {m['seconds_per_measurement']} s per measurement; "
    "client, sidecar, Postgres and Redis share the machine"
)
if steals:
    md.append(
        f"- CPU stolen by the hypervisor during the measurements: median {100 * med(steals):.1f} %, "
        f"max {100 * max(steals):.1f} % (compare figures across runs only where these are alike)"
    )
md.append("")
md.append("## Ratios (median of the per-round ratios)\n")
md.append("| ratio | per round | median | target | met |\n|---|---|---|---|---|")
for label, r in summary["ratios"].items():
    per = ", ".join(fmt(x, 2) for x in r["per_round"])
    met = "-" if not r["target"] or r["target"].startswith("(") else ("yes" if r["met"] else "no")
    md.append(f"| {label} | {per} | **{fmt(r['median'], 2)}** | {r['target']} | {met} |")
md.append("\n## Cost: CPU microseconds per operation (from /proc, median of rounds)\n")
md.append("| cost | per round (µs) | median (µs) | target | met |\n|---|---|---|---|---|")
for label, c in summary["costs"].items():
    per = ", ".join(fmt(x, 1) for x in c["per_round_us"])
    met = "-" if not c["target"] else ("yes" if c["met"] else "no")
    md.append(f"| {label} | {per} | **{fmt(c['median_us'], 1)}** | {c['target'] or '-'} | {met} |")
md.append("\n## Figures (medians)\n")
md.append(
    "Steal: the share of the machine's CPU time the hypervisor gave to other guests during each "
    "round's measurement (/proc/stat); a figure that moved with it moved with the machine.\n"
)
md.append("| measurement | per round | median /s | p99 ms (median) | steal % per round |\n|---|---|---|---|---|")
for name, f in summary["figures"].items():
    per = ", ".join(fmt(x) for x in f["per_round"])
    st = ", ".join(fmt(None if x is None else 100 * x, 1) for x in f["steal_share_per_round"])
    md.append(f"| {f['description']} | {per} | **{fmt(f['median'])}** | {fmt(f['p99_ms_median'], 2)} | {st} |")
if "memory" in summary:
    s = summary["memory"]
    md.append("\n## Memory\n")
    md.append(
        f"{s['distinct_keys']:,} distinct keys at {fmt(s['claims_per_s'])} claims/s: peak RSS (VmHWM) "
        f"**{s['vmhwm_mib']:.1f} MiB**, RSS at the end {s['vmrss_end_mib']:.1f} MiB; limit L1 budget "
        f"{s['l1_budget_mib']:.0f} MiB + 64 MiB = {s['limit_mib']:.0f} MiB: {'met' if s['met'] else 'NOT met'}; "
        f"ledger {'OK' if s['ledger_ok'] else 'MISMATCH'}."
    )
if "growth" in summary:
    g = summary["growth"]
    md.append("\n## Growth\n")
    md.append(
        f"Fresh claims at 64 clients (group commit on) with {g['existing_claims']:,} existing claims "
        f"(filled by bench/fill.sql in {g['fill_seconds']} s) vs an empty table, interleaved.\n\n"
        f"- p99 empty: {', '.join(fmt(x, 2) for x in g['p99_ms_empty_per_round'])} ms; "
        f"full: {', '.join(fmt(x, 2) for x in g['p99_ms_full_per_round'])} ms\n"
        f"- throughput empty {fmt(g['claims_per_s_empty'])}/s, full {fmt(g['claims_per_s_full'])}/s\n"
        f"- p99 ratio full/empty per round {', '.join(fmt(x, 2) for x in g['ratio_per_round'])}: "
        f"median **{fmt(g['ratio_median'], 2)}** (target {g['target']}: {'met' if g['met'] else 'NOT met'})"
    )
if "instructions" in summary:
    ins = summary["instructions"]
    md.append("\n## Cost: instructions per operation (callgrind, the process alone)\n")
    md.append(
        "Each figure: (instructions over the larger run − over the smaller) / (the difference in requests), "
        "16 clients; repeatable on a busy machine, unlike the CPU time above.\n"
    )
    md.append(
        "SHA-256 blocks: the digests' block function (inclusive). Valgrind hides the CPU's SHA extensions, "
        "so under it the digests run the portable code; natively (SHA-NI) they cost a small fraction of "
        "that, so the figure without them is the one to set beside the CPU time.\n"
    )
    md.append(
        "| process, operation | requests (small, large) | instructions per operation | of which SHA-256 blocks "
        "| without them |\n|---|---|---|---|---|"
    )
    for name, r in ins.items():
        sha = r.get("sha256_instructions_per_op")
        md.append(
            f"| {r['description']} | {r['deliveries_small']:,}, {r['deliveries_large']:,} | "
            f"**{fmt(r['instructions_per_op'])}** | {fmt(sha)} | "
            f"{fmt(None if sha is None else r['instructions_per_op'] - sha)} |"
        )
    if "in_dup_l1" in ins and "in_echo" in ins:
        ratio = ins["in_dup_l1"]["instructions_per_op"] / ins["in_echo"]["instructions_per_op"]
        md.append(f"\nL1 duplicate / echo call, instructions: **{ratio:.2f}**")
if "rate" in summary:
    rt = summary["rate"]
    md.append(f"\n## At a fixed {fmt(rt['offered_per_s'])} deliveries/s (open loop, 1 KiB, Redis L2 on)\n")
    md.append(
        f"{rt['seconds']} s per figure, medians of the rounds; mCPU and RSS from /proc of the process "
        "(the sidecar, or the echo), latency from each delivery's scheduled send time, added latency "
        "and mCPU ratio against the echo measured in the same round; Postgres CPU is the whole server's.\n"
    )
    md.append(
        "| figure | mCPU (per round) | × echo mCPU | CPU µs/op | thread sleeps/op | RSS MiB | p50 / p90 / p99 ms "
        "| added over echo p50 / p90 / p99 ms | Postgres µs per claim | load1 |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for name, row in rt.items():
        if not isinstance(row, dict) or "median" not in row:
            continue
        m_ = row["median"]
        label = ("before: " if name.startswith("before_") else "") + row["description"]
        per = ", ".join(fmt(v["millicores"]) for v in row["per_round"].values())
        md.append(
            f"| {label} | **{fmt(m_['millicores'])}** ({per}) | {fmt(m_['mcpu_over_echo'], 2)} | "
            f"{fmt(m_['cpu_us_per_op'], 1)} | {fmt(m_['switches_per_op'], 2)} | {fmt(m_['rss_mib'], 1)} | "
            f"{fmt(m_['p50_ms'], 2)} / {fmt(m_['p90_ms'], 2)} / {fmt(m_['p99_ms'], 2)} | "
            f"{fmt(m_['added_p50_ms'], 2)} / {fmt(m_['added_p90_ms'], 2)} / {fmt(m_['added_p99_ms'], 2)} | "
            f"{fmt(m_['postgres_cpu_us_per_claim'])} | {fmt(m_['load1'], 1)} |"
        )
text = "\n".join(md) + "\n"
open(base + ".md", "w").write(text)
print(text)
