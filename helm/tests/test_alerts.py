"""The shipped alert rules and dashboard, evaluated by Prometheus itself.

- The PrometheusRule the chart renders (templates/prometheusrule.yaml, with
  helm/tests/values/observability.yaml) is written out as a Prometheus rule
  file, checked by `promtool check rules` and unit-tested by `promtool test
  rules` with helm/tests/alerts/oncegate_test.yaml: every shipped alert fires
  on series the test writes and stays quiet on a healthy series.
- One live test: a real Prometheus (Debian's binary, its own port and
  directory) scrapes a running `oncegate serve` whose Redis Streams sink and
  L2 tier (one throwaway redis-server) go down while serving; the relay
  breaker and Redis tier breaker alerts fire, read from /api/v1/alerts, and
  resolve when Redis returns. Every dashboard query is run against that
  Prometheus and returns series.
- A second live test: a sidecar with ONCEGATE_REQUIRE_SYNC_REPLICA on a
  throwaway Postgres that names no synchronous standby refuses claims, and
  OncegateNoSynchronousStandby fires with the reason; a synchronous
  `pg_receivewal` named in synchronous_standby_names brings claims back and
  the alert resolves.

Needs promtool/prometheus (Debian package `prometheus`), redis-server, the
Postgres server binaries (initdb, pg_ctl, pg_receivewal: $ONCEGATE_TEST_PG_BIN
or Debian's postgresql) and the built binary (target/debug/oncegate or
$ONCEGATE_BIN).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml

from test_chart import NAMESPACE, REPO, dashboard, dashboard_exprs, free_port, load_values, one, parse_manifests, render, render_raw

HERE = pathlib.Path(__file__).resolve().parent
UNIT_TESTS = HERE / "alerts" / "oncegate_test.yaml"


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: install Debian's prometheus package (scripts/test does)"
    return path


def rule_groups(values: dict[str, Any]) -> dict[str, Any]:
    """The chart's PrometheusRule spec as a Prometheus rule file."""
    rule = one(parse_manifests(render_raw(values)), "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def shipped_alerts() -> set[str]:
    rule = one(render("observability"), "PrometheusRule")
    return {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


def write_rules(directory: pathlib.Path, values: dict[str, Any]) -> pathlib.Path:
    path = directory / "oncegate.rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(values), sort_keys=False))
    return path


def test_promtool_checks_the_rendered_rules(tmp_path):
    rules = write_rules(tmp_path, load_values("observability"))
    out = subprocess.run([tool("promtool"), "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(shipped_alerts())} rules found" in out.stdout, out.stdout


def test_promtool_check_is_not_vacuous(tmp_path):
    values = load_values("observability")
    groups = rule_groups(values)
    groups["groups"][0]["rules"][0]["expr"] = "max by (namespace) (oncegate_outbox_oldest_age_seconds > "
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text(yaml.safe_dump(groups))
    out = subprocess.run([tool("promtool"), "check", "rules", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0 and "OncegateOutboxEventsWaiting" in out.stdout + out.stderr


def unit_tests() -> dict[str, Any]:
    return yaml.safe_load(UNIT_TESTS.read_text())


def test_every_shipped_alert_has_a_firing_and_a_quiet_unit_test():
    fires, quiet = set(), set()
    for case in unit_tests()["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = shipped_alerts()
    assert sorted(alerts - fires) == [], "alerts no unit test makes fire"
    assert sorted(alerts - quiet) == [], "alerts no unit test keeps quiet"
    assert sorted((fires | quiet) - alerts) == [], "unit tests of alerts the chart does not ship"


def run_unit_tests(tmp_path: pathlib.Path, values: dict[str, Any]) -> subprocess.CompletedProcess:
    write_rules(tmp_path, values)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return subprocess.run([tool("promtool"), "test", "rules", UNIT_TESTS.name], cwd=tmp_path,
                          capture_output=True, text=True)


def test_promtool_unit_tests_of_every_alert(tmp_path):
    out = run_unit_tests(tmp_path, load_values("observability"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_unit_tests_fail_when_a_threshold_changes(tmp_path):
    """The cases sit on the thresholds: moving one breaks them."""
    values = load_values("observability")
    values["prometheusRule"]["outboxOldestAgeSeconds"] = 1200
    out = run_unit_tests(tmp_path, values)
    assert out.returncode != 0 and "OncegateOutboxEventsWaiting" in out.stdout + out.stderr, out.stdout


# --------------------------------------------------------------------------
# live: a real Prometheus scraping a sidecar whose broker goes down

# Shortened for the live test only, through the chart's own values: the
# breaker window (breakerOpenFor) and the outbox age threshold. Each rule's
# `for:` is replaced by LIVE_FOR (the one transformation not done by a value);
# the unit tests above check the shipped windows and `for:` durations.
LIVE_BREAKER_WINDOW = "6s"
LIVE_FOR = "3s"
LIVE_OUTBOX_AGE = 4
SCRAPE = "1s"
POD = "oncegate-live-0"


def wait_port(port: int, proc: subprocess.Popen, what: str, log: pathlib.Path, seconds: float = 20) -> None:
    deadline = time.time() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            assert proc.poll() is None, f"{what} exited: {log.read_text()[-2000:]}"
            assert time.time() < deadline, f"{what} is not listening on {port}: {log.read_text()[-2000:]}"
            time.sleep(0.1)


def live_rules(directory: pathlib.Path) -> pathlib.Path:
    values = load_values("observability")
    values["prometheusRule"] |= {"breakerOpenFor": LIVE_BREAKER_WINDOW, "outboxOldestAgeSeconds": LIVE_OUTBOX_AGE}
    groups = rule_groups(values)
    for g in groups["groups"]:
        g["interval"] = SCRAPE
        for r in g["rules"]:
            if "for" in r:
                r["for"] = LIVE_FOR
    path = directory / "oncegate.rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


class Live:
    def __init__(self, tmp: pathlib.Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.redis_port, self.grpc, self.metrics, self.prom = free_port(), free_port(), free_port(), free_port()
        self.redis: subprocess.Popen | None = None
        self.binary = pathlib.Path(os.environ.get("ONCEGATE_BIN", REPO / "target" / "debug" / "oncegate"))
        assert self.binary.exists(), f"{self.binary} is missing: build it first (cargo build), or set ONCEGATE_BIN"
        self.claims = 0
        self.outages = 0

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "a")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        self.procs.append(proc)
        return proc

    def start_redis(self) -> None:
        self.redis = self.spawn("redis", [tool("redis-server"), "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                          "--save", "", "--appendonly", "no", "--dir", str(self.tmp)])
        wait_port(self.redis_port, self.redis, "redis-server", self.tmp / "redis.log")

    def stop_redis(self) -> None:
        assert self.redis is not None
        self.redis.kill()
        self.outages += 1
        self.redis.wait(timeout=10)
        self.procs.remove(self.redis)
        self.redis = None

    def start_sidecar(self) -> None:
        env = {"PATH": os.environ.get("PATH", ""), "ONCEGATE_SQLITE_PATH": str(self.tmp / "oncegate.db"),
               "ONCEGATE_LISTEN": f"127.0.0.1:{self.grpc}", "ONCEGATE_METRICS_LISTEN": f"127.0.0.1:{self.metrics}",
               "ONCEGATE_RELAY_SINK": f"redis://127.0.0.1:{self.redis_port}", "ONCEGATE_RELAY_POLL": "100ms",
               # the same Redis as the L2 tier: its breaker opens with the outage too
               "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}",
               "ONCEGATE_RECONCILE_INTERVAL": "1s", "ONCEGATE_PURGE_INTERVAL": "1s",
               "ONCEGATE_AUDIT_FLUSH_INTERVAL": "100ms", "RUST_LOG": "info"}
        proc = self.spawn("sidecar", [str(self.binary), "serve"], env)
        wait_port(self.metrics, proc, "oncegate serve", self.tmp / "sidecar.log")
        deadline = time.time() + 20
        while self.submit(check=False) != 0:
            assert time.time() < deadline and proc.poll() is None, (self.tmp / "sidecar.log").read_text()[-2000:]
            time.sleep(0.2)

    def submit(self, check: bool = True, again: bool = False, amount: int = 100) -> int:
        """A fresh claim (an outbox event); `again`: the last one's duplicate."""
        self.claims += 0 if again else 1
        out = subprocess.run([str(self.binary), "submit", "--target", f"http://127.0.0.1:{self.grpc}",
                              "--award-id", f"AWD-LIVE-{self.claims}", "--amount-cents", str(amount),
                              "--timestamp", "2026-12-01T09:00:00Z", "--payload", "live"],
                             capture_output=True, text=True)
        assert not check or out.returncode == 0, out.stderr
        return out.returncode

    def start_prometheus(self) -> None:
        rules = live_rules(self.tmp)
        config = {
            "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
            "rule_files": [str(rules)],
            "scrape_configs": [{
                "job_name": "oncegate",
                "static_configs": [{"targets": [f"127.0.0.1:{self.metrics}"],
                                    # what the ServiceMonitor's discovery adds in a cluster
                                    "labels": {"namespace": NAMESPACE, "pod": POD}}],
            }],
        }
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        proc = self.spawn("prometheus", [tool("prometheus"), f"--config.file={self.tmp / 'prometheus.yml'}",
                                         f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                                         f"--web.listen-address=127.0.0.1:{self.prom}"])
        wait_port(self.prom, proc, "prometheus", self.tmp / "prometheus.log")
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.prom}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, (self.tmp / "prometheus.log").read_text()[-2000:]
            time.sleep(0.2)
        deadline = time.time() + 20
        while not self.api("query", query='up{job="oncegate"} == 1')["data"]["result"]:
            assert time.time() < deadline, self.api("targets")
            time.sleep(0.25)

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.prom}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        return body

    def alerts(self) -> dict[str, str]:
        """alertname -> state (pending | firing) of the active alerts."""
        body = self.api("alerts")
        assert body["status"] == "success", body
        return {a["labels"]["alertname"]: a["state"] for a in body["data"]["alerts"]}

    def wait_alert(self, name: str, states: set[str | None], seconds: float) -> tuple[float, list[str | None]]:
        """Polls until alert `name` is in one of `states` (None: not active);
        returns when, and every state seen on the way."""
        seen: list[str | None] = []
        deadline = time.time() + seconds
        while True:
            state = self.alerts().get(name)
            if not seen or seen[-1] != state:
                seen.append(state)
            if state in states:
                return time.time(), seen
            assert time.time() < deadline, f"{name}: states seen {seen}, wanted {states}; " \
                f"sidecar log: {(self.tmp / 'sidecar.log').read_text()[-1500:]}"
            time.sleep(0.25)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tool("prometheus"), tool("redis-server")
    env = Live(tmp_path_factory.mktemp("live-alerts"))
    try:
        env.start_redis()
        env.start_sidecar()
        env.start_prometheus()
        yield env
    finally:
        env.close()


def stream_length(live: Live) -> int:
    out = subprocess.run([tool("redis-cli"), "-p", str(live.redis_port), "xlen", "oncegate-events"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_broker_lost_while_serving_fires_the_relay_breaker_alert_and_it_resolves(live):
    # Healthy: the events reach the stream, no alert.
    for _ in range(3):
        live.submit()
    deadline = time.time() + 20
    while stream_length(live) < live.claims:
        assert time.time() < deadline, "the relay did not publish the claims' events"
        time.sleep(0.2)
    time.sleep(3)  # a few evaluations on a healthy series
    assert live.alerts() == {}, "no alert while everything is healthy"

    try:
        # The broker goes down while serving; new claims write outbox events.
        # The loss is timed from before the kill: the relay may see it before
        # stop_redis returns. The rule (min_over_time over the window) reads
        # scraped samples, so it can fire up to one scrape interval short of the
        # window after the breaker opened: the last sample before the loss may
        # be that much older than the loss.
        lost = time.time()
        live.stop_redis()
        published = live.claims
        for _ in range(3):
            live.submit()
        fired, seen = live.wait_alert("OncegateRelayBrokerUnreachable", {"firing"}, 60)
        window = float(LIVE_BREAKER_WINDOW.rstrip("s")) - float(SCRAPE.rstrip("s"))
        assert fired - lost >= window, f"fired {fired - lost:.1f}s after the loss, before the window less a scrape ({window}s)"
        assert seen[0] is None, seen
        alert = [a for a in live.api("alerts")["data"]["alerts"] if a["labels"]["alertname"] == "OncegateRelayBrokerUnreachable"][0]
        assert alert["labels"].items() >= {"namespace": NAMESPACE, "pod": POD, "sink": "redis", "severity": "warning"}.items(), alert
        print(f"OncegateRelayBrokerUnreachable firing {fired - lost:.1f}s after the broker was lost; states {seen}")
        live.submit()  # a lookup in the Redis tier while it is down
        fired_tier, seen_tier = live.wait_alert("OncegateRedisBreakerOpen", {"firing"}, 60)
        assert fired_tier - lost >= window, f"Redis tier alert fired {fired_tier - lost:.1f}s after the loss"
        print(f"OncegateRedisBreakerOpen firing {fired_tier - lost:.1f}s after Redis was lost; states {seen_tier}")

        # The broker returns on the same port: the relay resumes, the alert resolves.
        live.start_redis()
        back = time.time()
        resolved, seen = live.wait_alert("OncegateRelayBrokerUnreachable", {None}, 60)
        print(f"resolved {resolved - back:.1f}s after the broker returned; states {seen}")
        deadline = time.time() + 60
        while "OncegateRedisBreakerOpen" in live.alerts():
            assert time.time() < deadline, "the Redis tier alert did not resolve"
            live.submit()  # lookups let the tier's breaker probe and close
            time.sleep(0.5)
        print(f"OncegateRedisBreakerOpen resolved {time.time() - back:.1f}s after Redis returned")
        deadline = time.time() + 30
        while stream_length(live) < live.claims - published:
            assert time.time() < deadline, "the events written during the outage did not reach the stream"
            time.sleep(0.2)
        # The outbox age alert fired during the outage too; it resolves once the
        # relay has drained (the next test starts from no active alert).
        live.wait_alert("OncegateOutboxEventsWaiting", {None}, 30)
        # This redis-server keeps nothing across a restart (no RDB, no AOF): the
        # events published before the outage are gone from the stream, and the
        # scheduled reconciliation says so — the critical alert fires.
        live.wait_alert("OncegateReconciliationMismatch", {"firing"}, 30)
        mismatch = [a for a in live.api("alerts")["data"]["alerts"]
                    if a["labels"]["alertname"] == "OncegateReconciliationMismatch"][0]
        assert mismatch["labels"]["check"] == "broker" and float(mismatch["value"]) == published, mismatch
    finally:
        if live.redis is None:  # a failure above must not leave the next test without Redis
            live.start_redis()


def test_outbox_events_waiting_during_an_outage_goes_pending_then_firing(live):
    live.wait_alert("OncegateOutboxEventsWaiting", {None}, 30)  # not left active by an earlier outage
    live.stop_redis()
    try:
        for _ in range(3):
            live.submit()
        fired, seen = live.wait_alert("OncegateOutboxEventsWaiting", {"firing"}, 40)
        assert seen[0] is None and "pending" in seen and seen.index("pending") < seen.index("firing"), seen
    finally:
        live.start_redis()
    live.wait_alert("OncegateOutboxEventsWaiting", {None}, 60)


# Dashboard series the live sidecar cannot produce (SQLite, a healthy store,
# no Redis tier): each must still parse and is in test_chart.NOT_SCRAPED_HERE.
NO_SERIES_HERE = {
    "oncegate_audit_dropped_total", "oncegate_db_role_privileged", "oncegate_db_pool_connections",
    "oncegate_db_connections_held",
    "oncegate_group_commit_fallbacks_total", "oncegate_outbox_quarantined_total",
}


def grafana_to_promql(expr: str) -> str:
    """A panel query as Grafana sends it: the variables substituted."""
    expr = re.sub(r"^label_values\((.*),\s*\w+\s*\)$", r"\1", expr)
    return (expr.replace("$__rate_interval", "15s").replace('"$namespace"', f'"{NAMESPACE}"')
            .replace('"$pod"', '".+"'))


def test_every_dashboard_query_parses_and_returns_series_from_the_live_prometheus(live):
    from test_chart import NOT_SCRAPED_HERE, promql_metric_names
    assert NO_SERIES_HERE <= set(NOT_SCRAPED_HERE)
    exprs = dashboard_exprs(dashboard())
    assert len(exprs) > 20
    if not live.outages:  # run alone: the publish-error panel needs one
        live.stop_redis()
        live.submit()
        deadline = time.time() + 30
        while not live.api("query", query="oncegate_relay_breaker_state == 1")["data"]["result"]:
            assert time.time() < deadline, "the relay breaker did not open"
            time.sleep(0.25)
        live.start_redis()
    deadline = time.time() + 30
    while True:
        # fresh samples for the rates: a claim, its duplicate (a tier hit), a rejection
        live.submit()
        live.submit(again=True)
        assert live.submit(check=False, amount=0) != 0, "a zero amount is rejected"
        time.sleep(2)
        empty, errors = [], []
        for expr in exprs:
            query = grafana_to_promql(expr)
            assert "$" not in query, query
            body = live.api("query", query=query)
            if body["status"] != "success":
                errors.append(f"{expr}: {body.get('error')}")
            elif not body["data"]["result"] and not promql_metric_names(expr) & NO_SERIES_HERE:
                empty.append(expr)
        assert errors == [], "dashboard queries Prometheus refuses"
        if not empty:
            break
        assert time.time() < deadline, f"dashboard queries with no series from the live sidecar: {empty}"
    bad = live.api("query", query=grafana_to_promql("sum by (tier) (rate(oncegate_decisions_total{namespace=~\"$namespace\"}[5m])"))
    assert bad["status"] == "error", "the parse check is not vacuous"


# --------------------------------------------------------------------------
# live: the synchronous-standby guard's alert, on a real Postgres

def pg_tool(name: str) -> str:
    """A Postgres program: from $ONCEGATE_TEST_PG_BIN (scripts/test), Debian's
    newest /usr/lib/postgresql/N/bin, or the PATH."""
    dirs = [os.environ.get("ONCEGATE_TEST_PG_BIN", "")]
    dirs += sorted((str(p) for p in pathlib.Path("/usr/lib/postgresql").glob("*/bin")), reverse=True)
    for d in dirs:
        if d and (pathlib.Path(d) / name).exists():
            return str(pathlib.Path(d) / name)
    return tool(name)


def as_postgres(argv: list[str]) -> list[str]:
    """Postgres' server programs refuse to run as root."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class GuardLive(Live):
    """A throwaway Postgres naming no synchronous standby, a sidecar that
    requires one, and Prometheus scraping the sidecar."""

    def start_postgres(self) -> None:
        # Outside pytest's directory, which only root may enter.
        self.pgroot = pathlib.Path(tempfile.mkdtemp(prefix="oncegate-guard-"))
        self.pg_port, self.pgdata = free_port(), self.pgroot / "data"
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres", str(self.pgroot)], check=True)
        out = subprocess.run(as_postgres([pg_tool("initdb"), "-D", str(self.pgdata), "-A", "trust", "-U", "root",
                                          "--no-sync"]), capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        options = f"-p {self.pg_port} -k {self.pgroot} -c listen_addresses=127.0.0.1 -c fsync=off"
        out = subprocess.run(as_postgres([pg_tool("pg_ctl"), "-D", str(self.pgdata), "-o", options, "-l",
                                          str(self.pgroot / "postgres.log"), "-w", "start"]),
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr

    def psql(self, sql: str) -> None:
        subprocess.run([pg_tool("psql"), "-X", "-q", "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "root",
                        "-d", "postgres", "-c", sql], check=True, capture_output=True)

    def start_sidecar(self) -> None:
        env = {"PATH": os.environ.get("PATH", ""),
               "DATABASE_URL": f"postgres://root@127.0.0.1:{self.pg_port}/postgres",
               "ONCEGATE_REQUIRE_SYNC_REPLICA": "true", "ONCEGATE_PRIMARY_PROBE_INTERVAL": "200ms",
               "ONCEGATE_LISTEN": f"127.0.0.1:{self.grpc}", "ONCEGATE_METRICS_LISTEN": f"127.0.0.1:{self.metrics}",
               "ONCEGATE_RECONCILE_INTERVAL": "0s", "ONCEGATE_PURGE_INTERVAL": "0s", "RUST_LOG": "info"}
        proc = self.spawn("sidecar", [str(self.binary), "serve"], env)
        wait_port(self.metrics, proc, "oncegate serve", self.tmp / "sidecar.log")

    def submit_status(self) -> subprocess.CompletedProcess:
        self.claims += 1
        return subprocess.run([str(self.binary), "submit", "--target", f"http://127.0.0.1:{self.grpc}",
                               "--award-id", f"AWD-GUARD-{self.claims}", "--amount-cents", "100",
                               "--timestamp", "2026-12-05T09:00:00Z", "--payload", "guard"],
                              capture_output=True, text=True, timeout=60)

    def close(self) -> None:
        super().close()
        if hasattr(self, "pgroot"):
            subprocess.run(as_postgres([pg_tool("pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "-w", "stop"]),
                           capture_output=True)
            shutil.rmtree(self.pgroot, ignore_errors=True)


def test_no_synchronous_standby_fires_the_guard_alert_with_its_reason_and_it_resolves(tmp_path):
    tool("prometheus")
    live = GuardLive(tmp_path)
    try:
        live.start_postgres()
        live.start_sidecar()
        live.start_prometheus()
        refused = live.submit_status()
        assert refused.returncode != 0 and "synchronous_standby_names is empty" in refused.stderr, refused.stderr
        _, seen = live.wait_alert("OncegateNoSynchronousStandby", {"firing"}, 60)
        assert "pending" in seen, f"pending before firing: {seen}"
        firing = [a for a in live.api("alerts")["data"]["alerts"]
                  if a["labels"]["alertname"] == "OncegateNoSynchronousStandby"]
        assert [a["labels"]["reason"] for a in firing] == ["no_standby_named"], firing
        # A synchronous standby: pg_receivewal flushing what it receives.
        wal = live.tmp / "wal"
        wal.mkdir()
        live.spawn("pg_receivewal", [pg_tool("pg_receivewal"), "-D", str(wal), "--synchronous", "--no-loop", "-d",
                                     f"host=127.0.0.1 port={live.pg_port} user=root application_name=rx1"])
        live.psql("ALTER SYSTEM SET synchronous_standby_names = 'rx1'")
        live.psql("SELECT pg_reload_conf()")
        live.wait_alert("OncegateNoSynchronousStandby", {None}, 60)
        deadline = time.time() + 30
        while (claimed := live.submit_status()).returncode != 0:
            assert time.time() < deadline, claimed.stderr
            time.sleep(0.5)
        assert "CLAIMED" in claimed.stdout, claimed.stdout
    finally:
        live.close()
