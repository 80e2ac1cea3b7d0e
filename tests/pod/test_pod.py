"""The chart's rendered pod, run on one machine with `podman kube play`.

The chart is rendered with helm/tests/values/podman.yaml (plus this run's
Secret names, ports, app role and streams, as `--set` would add them), then:

1. the migration Job hook runs first, as the schema owner, granting the app
   role (podman plays no Jobs: its pod template is played as a Pod);
2. the Deployment's pod runs: the oncegate sidecar from scripts/image's image
   and the Python Redis Streams consumer beside it, against the suite's
   Postgres and Redis on the host;
3. the probes pass (run here as the kubelet runs `grpc:` probes: podman does
   not run them), claims flow through the sidecar into Postgres as the app
   role, a SIGKILLed sidecar is restarted by the restart policy and replays
   its audit spool from the emptyDir, and SIGTERM drains the claims in flight.

Where podman differs from the kubelet, and how this test covers it, is in
docs/DEPLOYMENT.md ("Trying the chart's pod with podman").

Run through `scripts/image --pod` (which builds the images and the virtualenv);
needs ONCEGATE_TEST_DATABASE_URL (a superuser) and ONCEGATE_TEST_REDIS_URL.
The tests run in order on one pod: each phase starts where the last ended.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

import helm_python as helm
import psycopg
import pytest
import redis
import yaml

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART = REPO / "helm" / "oncegate"
VALUES = REPO / "helm" / "tests" / "values" / "podman.yaml"
sys.path.insert(0, str(HERE))
from probe import check, wait_serving  # noqa: E402

# What podman runs containers with here: runc (crun fails on this kind of
# machine's hybrid cgroups), and rlimits it may set (kube play has no
# --ulimit flag; containers.conf carries them, to the restarts too).
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""
WORKERS = 8  # the consumer's threads: the claims in flight at SIGTERM
CLAIMS = 40


def log(msg: str) -> None:
    print(f"pod: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0, every: float = 0.1) -> Any:
    """Polls `probe` until it returns something truthy; fails naming `what`
    and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached in {timeout:.0f} s (last: {value!r})")
        time.sleep(every)


def idempotency_key(award_id: str, timestamp: str, payload: bytes) -> str:
    """DESIGN.md §1, byte for byte."""
    digest = hashlib.sha256(payload).hexdigest()
    return hashlib.sha256(f"{award_id}|{timestamp}|{digest}".encode()).hexdigest()


# --------------------------------------------------------------------------
# podman


@dataclass
class Podman:
    conf_dir: pathlib.Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf_dir / "containers.conf")}

    def __call__(self, *args: str, check: bool = True, input: str | None = None,
                 timeout: float = 300) -> str:
        done = subprocess.run(["podman", "--runtime", "runc", *args], env=self.env(), input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
        return done.stdout

    def inspect(self, container: str, fmt: str) -> str:
        return self("inspect", "--format", fmt, container).strip()

    def logs(self, container: str) -> str:
        done = subprocess.run(["podman", "logs", container], capture_output=True, text=True,
                              env=self.env())
        return done.stdout + done.stderr

    def play(self, manifests: list[dict[str, Any]], path: pathlib.Path) -> None:
        path.write_text(yaml.safe_dump_all(manifests, sort_keys=False))
        # hostNetwork for the whole pod: the suite's services are on the host's loopback
        self("kube", "play", "--network", "host", str(path))

    def secret(self, name: str, data: dict[str, str]) -> None:
        # podman 4.3 reads a secretKeyRef's Secret as JSON {key: base64}; a
        # kube-played `kind: Secret` is stored as YAML and then cannot be read.
        body = json.dumps({k: base64.b64encode(v.encode()).decode() for k, v in data.items()})
        self("secret", "rm", name, check=False)
        self("secret", "create", name, "-", input=body)


# --------------------------------------------------------------------------
# the run's database, Redis names and rendered chart


@dataclass
class Run:
    id: str
    admin_url: str
    redis_url: str
    podman: Podman
    workdir: pathlib.Path
    release: str = ""
    db: str = ""
    owner: str = ""
    app: str = ""
    stream: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    manifests: list[dict[str, Any]] = field(default_factory=list)
    entries: list[dict[str, str]] = field(default_factory=list)
    played: list[pathlib.Path] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    started: float = 0.0

    def __post_init__(self) -> None:
        self.release = f"pod{self.id}"
        self.db = f"og_pod_{self.id}"
        self.owner, self.app = f"og_pod_{self.id}_owner", f"og_pod_{self.id}_app"
        self.stream = f"oncegate-pod-{self.id}:grants"
        self.ports = {"gate": free_port(), "health": free_port(), "metrics": free_port()}

    # names podman gives the Deployment's pod and its containers
    @property
    def pod(self) -> str:
        return f"{self.release}-oncegate-pod-0"

    @property
    def sidecar(self) -> str:
        return f"{self.pod}-oncegate"

    @property
    def consumer(self) -> str:
        return f"{self.pod}-consumer"

    def url(self, user: str) -> str:
        u = urllib.parse.urlsplit(self.admin_url)
        host = u.hostname or "127.0.0.1"
        return f"postgres://{user}@{host}:{u.port or 5432}/{self.db}"

    def sql(self, query: str, *params: Any) -> list[tuple]:
        """One statement as the superuser, in the run's database."""
        u = urllib.parse.urlsplit(self.admin_url)
        with psycopg.connect(u._replace(path=f"/{self.db}").geturl(), autocommit=True) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else []

    def metrics(self) -> dict[str, float]:
        """The sidecar's unlabelled series (and labelled ones by full name)."""
        url = f"http://127.0.0.1:{self.ports['metrics']}/metrics"
        try:
            text = urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def consumer_lines(self) -> list[dict[str, Any]]:
        """The consumer's stdout: one JSON line per handled entry."""
        lines = []
        for line in self.podman.logs(self.consumer).splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines


def metric(run: Run, name: str) -> float:
    """A series of the sidecar's /metrics, once it is exported."""
    return wait_for(f"{name} on /metrics", lambda: (m := run.metrics()).get(name) is not None and m)[name]


def values(run: Run) -> dict[str, Any]:
    v = helm.values_from_yaml(VALUES.read_text())
    repo, _, tag = os.environ.get("ONCEGATE_IMAGE", "localhost/oncegate:local").rpartition(":")
    v["image"].update(repository=repo, tag=tag)
    crepo, _, ctag = os.environ.get("ONCEGATE_CONSUMER_IMAGE", "localhost/oncegate-consumer:local").rpartition(":")
    v["example"]["app"]["image"].update(repository=crepo, tag=ctag)
    names = {k: f"og-pod-{run.id}-{k}" for k in ("postgres", "postgres-owner", "redis", "relay")}
    v["database"]["existingSecret"] = names["postgres"]
    v["migration"]["database"]["existingSecret"] = names["postgres-owner"]
    v["migration"]["appRole"] = run.app
    v["redis"]["existingSecret"] = names["redis"]
    v["relay"]["existingSecret"] = names["relay"]
    v["relay"]["stream"] = f"oncegate-pod-{run.id}:events"
    v["example"]["app"]["env"][0]["valueFrom"]["secretKeyRef"]["name"] = names["redis"]
    for key in ("gate", "health", "metrics"):
        v.setdefault(key, {})["port"] = run.ports[key]
    v["extraEnv"].append({"name": "ONCEGATE_REDIS_KEY_PREFIX", "value": f"oncegate-pod-{run.id}:"})
    args = v["example"]["app"]["args"]
    args[args.index("--stream") + 1] = run.stream
    return v


def render(run: Run) -> list[dict[str, Any]]:
    rendered = helm.Chart.load(CHART).render(values(run), name=run.release, namespace="default",
                                             is_install=True)
    docs = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def make_database(run: Run) -> None:
    """The owner/app split the chart expects: the owner owns the database
    (the migration Job's credential), the app role only logs in (the Job
    grants it its privileges)."""
    with psycopg.connect(run.admin_url, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{run.owner}" LOGIN')
        c.execute(f'CREATE ROLE "{run.app}" LOGIN')
        c.execute(f'CREATE DATABASE "{run.db}" OWNER "{run.owner}"')


def drop_database(run: Run) -> None:
    with psycopg.connect(run.admin_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{run.db}" WITH (FORCE)')
        for role in (run.app, run.owner):
            c.execute(f'DROP ROLE IF EXISTS "{role}"')


def make_secrets(run: Run, v: dict[str, Any]) -> None:
    """The Secrets the values name, as `kubectl create secret` would make them."""
    data = {
        v["database"]["existingSecret"]: run.url(run.app),
        v["migration"]["database"]["existingSecret"]: run.url(run.owner),
        v["redis"]["existingSecret"]: run.redis_url,
        v["relay"]["existingSecret"]: run.redis_url,
    }
    for name, url in data.items():
        run.podman.secret(name, {"url": url})
        run.secrets.append(name)


def job_as_pod(job: dict[str, Any]) -> dict[str, Any]:
    """podman plays no Jobs; the Job's pod template as a Pod runs the same container."""
    template = job["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": job["metadata"]["name"], "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def without_ports(workload: dict[str, Any]) -> dict[str, Any]:
    """The workload without its containers' `ports`. To the kubelet they only
    name the ports (the probes use numbers); podman 4.x publishes each one
    on the host, which the host network refuses ("PortMappings can only be
    used with Bridge or slirp4netns networking")."""
    copy = json.loads(json.dumps(workload))
    for c in copy["spec"]["template"]["spec"]["containers"]:
        c.pop("ports", None)
    return copy


def run_migration_hook(run: Run) -> None:
    jobs = [d for d in run.manifests if d["kind"] == "Job"]
    assert [j["metadata"]["annotations"]["helm.sh/hook"] for j in jobs] == ["pre-install,pre-upgrade"]
    pod = job_as_pod(jobs[0])
    path = run.workdir / "migrate.yaml"
    run.podman.play([pod], path)
    run.played.append(path)
    container = f"{pod['metadata']['name']}-migrate"
    code = run.podman("wait", container, timeout=180).strip()
    logs = run.podman.logs(container)
    assert code == "0", f"the migration Job's container exited {code}:\n{logs}"
    run.podman("kube", "down", str(path))  # hook-delete-policy: hook-succeeded
    run.played.remove(path)


# --------------------------------------------------------------------------
# the pod, once for the module


@pytest.fixture(scope="module")
def run():
    admin = os.environ.get("ONCEGATE_TEST_DATABASE_URL")
    redis_url = os.environ.get("ONCEGATE_TEST_REDIS_URL")
    if not admin or not redis_url:
        pytest.fail("ONCEGATE_TEST_DATABASE_URL and ONCEGATE_TEST_REDIS_URL must name the suite's "
                    "Postgres (a superuser) and Redis: run through scripts/test or scripts/image --pod")
    with tempfile.TemporaryDirectory(prefix="oncegate-pod-") as tmp:
        workdir = pathlib.Path(tmp)
        (workdir / "containers.conf").write_text(CONTAINERS_CONF)
        r = Run(id=secrets.token_hex(3), admin_url=admin, redis_url=redis_url,
                podman=Podman(workdir), workdir=workdir)
        try:
            yield start(r)
        finally:
            stop(r)


def start(run: Run) -> Run:
    make_database(run)
    v = values(run)
    make_secrets(run, v)
    run.manifests = render(run)
    kinds = sorted(d["kind"] for d in run.manifests)
    assert kinds == ["Deployment", "Job"], f"rendered {kinds}: the test plays a Job and a Deployment"
    run_migration_hook(run)
    log(f"migrated {run.db} as {run.owner}, granted {run.app}")
    deployment = [without_ports(d) for d in run.manifests if d["kind"] == "Deployment"]
    path = run.workdir / "pod.yaml"
    run.started = time.monotonic()
    run.podman.play(deployment, path)
    run.played.append(path)
    return run


def stop(run: Run) -> None:
    for path in reversed(run.played):
        start = time.monotonic()
        run.podman("kube", "down", str(path), check=False)
        log(f"kube down {path.name}: {time.monotonic() - start:.1f} s")
    for name in run.secrets:
        run.podman("secret", "rm", name, check=False)
    try:
        drop_database(run)
    finally:
        r = redis.Redis.from_url(run.redis_url)
        keys = list(r.scan_iter(match=f"oncegate-pod-{run.id}:*", count=1000))
        if keys:
            r.delete(*keys)


def pod_spec(run: Run) -> dict[str, Any]:
    return [d for d in run.manifests if d["kind"] == "Deployment"][0]["spec"]["template"]["spec"]


def sidecar_spec(run: Run) -> dict[str, Any]:
    return [c for c in pod_spec(run)["containers"] if c["name"] == "oncegate"][0]


def push(run: Run, entries: list[dict[str, str]]) -> None:
    r = redis.Redis.from_url(run.redis_url)
    for e in entries:
        r.xadd(run.stream, e)


def entries(run: Run, first: int, n: int) -> list[dict[str, str]]:
    return [{"award_id": f"AWD-POD-{run.id}-{i % 5}", "submission_timestamp": f"2026-12-04T10:{i // 60:02d}:{i % 60:02d}Z",
             "amount_cents": str(100 + i), "payload": f"grant {i}"} for i in range(first, first + n)]


def keys_of(entries: list[dict[str, str]]) -> set[str]:
    return {idempotency_key(e["award_id"], e["submission_timestamp"], e["payload"].encode()) for e in entries}


def pending(run: Run) -> int:
    """Entries delivered to the consumer group and not acked (-1: no group yet)."""
    r = redis.Redis.from_url(run.redis_url)
    try:
        return r.xpending(run.stream, "disbursers")["pending"]
    except redis.ResponseError:
        return -1


def acked_entry_ids(run: Run) -> set[str]:
    """Entries the consumer group took and acked: delivered, no longer pending."""
    r = redis.Redis.from_url(run.redis_url)
    info = {g["name"].decode(): g for g in r.xinfo_groups(run.stream)}["disbursers"]
    last = info["last-delivered-id"].decode()
    delivered = {i.decode() for i, _ in r.xrange(run.stream, max=last)}
    still = {p["message_id"].decode() for p in r.xpending_range(run.stream, "disbursers", "-", "+", 100_000)}
    return delivered - still


def ledger_keys(run: Run) -> set[str]:
    return {k for (k,) in run.sql("SELECT idempotency_key FROM disbursements")}


# --------------------------------------------------------------------------
# the phases, in order


def test_probes_pass(run):
    """The sidecar's startup, readiness and liveness probes, run as the
    kubelet runs `grpc:` probes (podman runs none of them)."""
    c = sidecar_spec(run)
    startup = c["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    took = wait_serving(f"127.0.0.1:{startup['grpc']['port']}", startup["grpc"]["service"], wait=budget,
                        period=0.05)
    since_play = time.monotonic() - run.started
    started = run.podman.inspect(run.sidecar, '{{.State.StartedAt.Format "2006-01-02T15:04:05.000000Z07:00"}}')
    log(f"startup probe SERVING {since_play:.2f} s after podman kube play began (probed for {took:.2f} s; "
        f"the container started at {started})")
    for name in ("readinessProbe", "livenessProbe"):
        p = c[name]
        assert check(f"127.0.0.1:{p['grpc']['port']}", p["grpc"]["service"]) == "SERVING", name
    assert run.podman.inspect(run.consumer, "{{.State.Status}}") == "running", run.podman.logs(run.consumer)


def test_sidecar_runs_locked_down_as_the_app_role(run):
    pid = run.podman.inspect(run.sidecar, "{{.State.Pid}}")
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split()[:2] == ["65532", "65532"], fields["Uid"]
    assert int(fields["CapEff"].strip(), 16) == 0, f"capabilities left: {fields['CapEff']}"
    assert fields["NoNewPrivs"].strip() == "1"
    assert run.podman.inspect(run.sidecar, "{{.HostConfig.ReadonlyRootfs}}") == "true"
    users = wait_for("the sidecar's connections to the run's database",
                     lambda: run.sql("SELECT DISTINCT usename FROM pg_stat_activity "
                                     "WHERE datname = %s AND pid <> pg_backend_pid()", run.db))
    assert users == [(run.app,)], f"connected to {run.db} as {users}, want only the app role {run.app}"
    assert metric(run, "oncegate_db_role_privileged") == 0, "the sidecar reports its role privileged"


def test_claims_go_through_the_sidecar_into_postgres(run):
    fresh = entries(run, 0, CLAIMS)
    push(run, fresh)
    run.entries += fresh
    lines = wait_for(f"{CLAIMS} entries handled and acked",
                     lambda: len(run.consumer_lines()) >= CLAIMS and pending(run) == 0 and run.consumer_lines())
    assert sorted(line["outcome"] for line in lines) == ["CLAIMED"] * CLAIMS, lines
    assert {line["key"] for line in lines} == keys_of(fresh)
    assert ledger_keys(run) == keys_of(fresh)
    totals = dict(run.sql("SELECT award_id, total_cents FROM award_balances"))
    want: dict[str, int] = {}
    for e in fresh:
        want[e["award_id"]] = want.get(e["award_id"], 0) + int(e["amount_cents"])
    assert totals == want
    r = redis.Redis.from_url(run.redis_url)
    events = f"oncegate-pod-{run.id}:events"
    wait_for(f"the relay publishing {CLAIMS} events to {events}", lambda: r.xlen(events) >= CLAIMS, timeout=60)


def spool_rows(run: Run) -> list[dict[str, Any]]:
    """Rows in the sidecar's spool (its emptyDir, read from the host) not yet
    recorded as written."""
    mounts = json.loads(run.podman.inspect(run.sidecar, "{{json .Mounts}}"))
    spool_dir = [m for m in mounts if m["Destination"] == "/var/spool/oncegate"][0]["Source"]
    path = pathlib.Path(spool_dir)
    flushed = int((path / "flushed").read_text().strip() or 0) if (path / "flushed").exists() else 0
    rows = []
    for seg in sorted(path.glob("seg-*.jsonl")):
        for line in seg.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line being appended right now
                continue
            if row["n"] > flushed:
                rows.append(row)
    return rows


def duplicate_audit_rows(run: Run) -> list[tuple]:
    return run.sql("SELECT key_prefix, tier, instance FROM audit_log WHERE decision = 'duplicate'")


def test_a_killed_sidecar_replays_its_audit_spool(run):
    again = run.entries[:CLAIMS]
    handled = len(run.consumer_lines())
    push(run, again)
    lines = wait_for(f"{CLAIMS} redeliveries handled and acked",
                     lambda: len(run.consumer_lines()) >= handled + CLAIMS and pending(run) == 0
                     and run.consumer_lines()[handled:])
    assert {line["outcome"] for line in lines} == {"DUPLICATE"}, lines
    assert {line["decided_by"] for line in lines} <= {"LOCAL_CACHE", "REDIS"}, lines
    rows = wait_for(f"{CLAIMS} duplicate rows in the spool",
                    lambda: len(spool_rows(run)) >= CLAIMS and spool_rows(run))
    assert len(rows) == CLAIMS and {r["decision"] for r in rows} == {"duplicate"}, rows
    assert duplicate_audit_rows(run) == [], "the flush interval is 1h: no duplicate row is written yet"

    restarts = int(run.podman.inspect(run.sidecar, "{{.RestartCount}}"))
    # The process is killed, as the OOM killer would: `podman kill` marks the
    # container stopped by the user, which podman's restart policy honours.
    os.kill(int(run.podman.inspect(run.sidecar, "{{.State.Pid}}")), signal.SIGKILL)
    wait_for("the restart policy restarting the killed sidecar",
             lambda: int(run.podman.inspect(run.sidecar, "{{.RestartCount}}")) > restarts
             and run.podman.inspect(run.sidecar, "{{.State.Status}}") == "running", timeout=60)
    wait_serving(f"127.0.0.1:{run.ports['health']}", "", wait=120)
    written = wait_for(f"the {CLAIMS} spooled rows written by the restarted sidecar",
                       lambda: len(duplicate_audit_rows(run)) >= CLAIMS and duplicate_audit_rows(run))
    prefixes = {k[:12] for k in keys_of(again)}
    assert len(written) == CLAIMS, f"{len(written)} duplicate rows, want {CLAIMS} (none twice)"
    assert {row[0] for row in written} == prefixes
    assert {row[2] for row in written} == {run.pod}, "the rows keep the instance that decided them"
    assert run.metrics().get("oncegate_audit_spool_replayed_total") == CLAIMS
    log(f"spool replay: {len(written)} duplicate audit rows written after SIGKILL and restart")


def test_sigterm_drains_the_claims_in_flight(run):
    """Claims held in flight by a table lock when the pod is stopped (SIGTERM,
    then SIGKILL after the grace period, as the kubelet does): the sidecar
    answers all of them before it exits, the consumer acks them, and every
    acked entry is in the ledger."""
    grace = int(pod_spec(run)["terminationGracePeriodSeconds"])
    before = len(run.consumer_lines())
    held = entries(run, CLAIMS, WORKERS)
    u = urllib.parse.urlsplit(run.admin_url)
    with psycopg.connect(u._replace(path=f"/{run.db}").geturl()) as locker:
        locker.execute("LOCK TABLE processed_messages IN EXCLUSIVE MODE")
        push(run, held)
        run.entries += held
        wait_for(f"{WORKERS} claims in flight in the sidecar",
                 lambda: run.metrics().get("oncegate_requests_in_flight") == WORKERS)
        wait_for("a claim transaction waiting on the lock",
                 lambda: run.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                                 "AND usename = %s AND wait_event_type = 'Lock'", run.db, run.app)[0][0] > 0)
        sigterm = time.time()
        stopping = threading.Thread(target=run.podman, args=("pod", "stop", "--time", str(grace), run.pod))
        stopping.start()
        wait_for("the sidecar draining", lambda: "shutdown signal received; draining" in run.podman.logs(run.sidecar))
        in_flight = run.metrics().get("oncegate_requests_in_flight")
        released = time.time()
        locker.rollback()
    stopping.join(timeout=grace + 30)
    assert not stopping.is_alive(), "podman pod stop did not return"

    code = run.podman.inspect(run.sidecar, "{{.State.ExitCode}}")
    logs = run.podman.logs(run.sidecar)
    assert code == "0", f"the sidecar exited {code} (137: killed after the grace period)\n{logs[-3000:]}"
    assert "oncegate stopped" in logs and "outlived the shutdown grace" not in logs
    finished = run.podman.inspect(run.sidecar, '{{.State.FinishedAt.Format "2006-01-02T15:04:05.000000Z07:00"}}')
    end = datetime.fromisoformat(finished).timestamp()
    assert in_flight == WORKERS, f"{in_flight} requests in flight while draining, want {WORKERS}"
    after = run.consumer_lines()[before:]
    assert sorted(line["outcome"] for line in after) == ["CLAIMED"] * WORKERS, after
    assert {line["key"] for line in after} == keys_of(held)
    assert pending(run) == 0, "an answered claim was not acked"
    assert keys_of(held) <= ledger_keys(run)
    acked = acked_entry_ids(run)
    r = redis.Redis.from_url(run.redis_url)
    acked_keys = {idempotency_key(f[b"award_id"].decode(), f[b"submission_timestamp"].decode(), f[b"payload"])
                  for i, f in r.xrange(run.stream) if i.decode() in acked}
    assert acked_keys <= ledger_keys(run), "an acked entry is missing from the ledger"
    log(f"drain: {in_flight:.0f} claims in flight at SIGTERM, all answered and acked; the sidecar exited 0 "
        f"{end - sigterm:.2f} s after SIGTERM ({end - released:.2f} s after the lock was released; grace {grace} s)")
