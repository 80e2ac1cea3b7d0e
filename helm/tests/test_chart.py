"""Checks of the oncegate Helm chart, offline: lint, render, Kubernetes 1.30
schemas, the locked-down security context, secrets by reference, probes,
shutdown budget, the migration hook, the two-line sidecar include, and the
Grafana dashboard and alert rules against the metrics a real sidecar
exports (target/debug/oncegate or $ONCEGATE_BIN, started locally).

Run through `helm/check`, which prepares the virtualenv.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import shutil
from typing import Any, Iterator

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART = REPO / "helm" / "oncegate"
VALUES_DIR = HERE / "values"
KUBE_VERSION = "1.30"
RELEASE = "rel"
NAMESPACE = "payments"

VALUES_FILES = sorted(p.stem for p in VALUES_DIR.glob("*.yaml"))
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet", "Pod"}
PROMETHEUS_OPERATOR_GROUP = "monitoring.coreos.com"


# --------------------------------------------------------------------------
# rendering


def load_values(name: str) -> dict[str, Any]:
    """A values file parsed the way `helm -f` parses it."""
    return helm.values_from_yaml((VALUES_DIR / f"{name}.yaml").read_text())


@functools.lru_cache(maxsize=None)
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render_raw(values: dict[str, Any], chart_obj: helm.Chart | None = None) -> dict[str, str]:
    return (chart_obj or chart()).render(
        values, name=RELEASE, namespace=NAMESPACE, is_install=True
    )


def parse_manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("metadata", {})
                docs.append(doc)
    return docs


@functools.lru_cache(maxsize=None)
def _render_file(name: str) -> tuple[str, str]:
    rendered = render_raw(load_values(name))
    notes = "".join(v for k, v in rendered.items() if k.endswith("NOTES.txt"))
    return json.dumps(parse_manifests(rendered)), notes


def render(name: str) -> list[dict[str, Any]]:
    """The manifests rendered with helm/tests/values/<name>.yaml (a fresh copy)."""
    return json.loads(_render_file(name)[0])


def notes(name: str) -> str:
    return _render_file(name)[1]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    if workload["kind"] == "Pod":
        return workload["spec"]
    return workload["spec"]["template"]["spec"]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in WORKLOAD_KINDS:
            yield f"{d['kind']}/{d['metadata']['name']}", pod_spec(d)
        elif d["kind"] == "CronJob":
            yield f"CronJob/{d['metadata']['name']}", d["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return (
        spec.get("initContainers", [])
        + spec.get("containers", [])
        + spec.get("ephemeralContainers", [])
    )


def sidecar_of(spec: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in all_containers(spec) if c["name"] == "oncegate"]
    assert len(found) == 1, "expected exactly one container named oncegate"
    return found[0]


def deployment_sidecar(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = pod_spec(one(docs, "Deployment"))
    return spec, sidecar_of(spec)


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [e["name"] for e in container.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env names in {container['name']}: {names}"
    return {e["name"]: e for e in container.get("env", [])}


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0].strip("[]")


# --------------------------------------------------------------------------
# lint and schema


def test_values_files_cover_the_required_scenarios():
    assert {"minimal", "production", "tls", "observability", "sqlite", "demo"} <= set(VALUES_FILES)


@pytest.mark.parametrize("values_name", [None, *VALUES_FILES])
def test_lint_strict(values_name):
    values = load_values(values_name) if values_name else None
    report = helm.lint(CHART, values, strict=True, kube_version="v1.30.0", namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], json.dumps(report, indent=2)


def test_values_schema_is_closed():
    """Every object the schema describes field by field rejects unknown keys."""
    open_objects = []

    def walk(node: dict[str, Any], path: str) -> None:
        if "properties" in node:
            if node.get("additionalProperties") is not False:
                open_objects.append(path or "<root>")
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}" if path else key)

    walk(chart().schema, "")
    assert open_objects == []


@pytest.mark.parametrize(
    "override, complaint",
    [
        ({"imagee": {"tag": "x"}}, "imagee"),
        ({"gate": {"port": "50051"}}, "/gate/port"),
        ({"relay": {"sink": "redis://:secret@redis:6379"}}, "/relay/sink"),
        ({"logFormat": "xml"}, "/logFormat"),
        ({"database": {"insecureDemoUrl": "mysql://x"}}, "/database/insecureDemoUrl"),
        ({"sqlite": {"path": "oncegate.db"}}, "/sqlite/path"),
        ({"gate": {"bindAddress": "localhost"}}, "/gate/bindAddress"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"migration": {"database": {"existingSecrett": "pg"}}}, "existingSecrett"),
        ({"migration": {"database": {"insecureDemoUrl": "mysql://x"}}}, "/migration/database/insecureDemoUrl"),
        ({"migration": {"appRole": "app; DROP TABLE audit_log"}}, "/migration/appRole"),
    ],
)
def test_schema_rejects_bad_values(override, complaint):
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        render_raw(override)


@pytest.mark.parametrize(
    "override, complaint",
    [
        ({"example": {"replicaCount": 2}}, "own ledger"),
        ({"terminationGracePeriodSeconds": 20}, "terminationGracePeriodSeconds"),
        ({"gate": {"bindAddress": "0.0.0.0"}}, "enable tls"),
        ({"tls": {"enabled": True}}, "tls.secretName"),
        (
            {"database": {"existingSecret": "pg", "insecureDemoUrl": "postgres://u:p@h/d"}},
            "not both",
        ),
        ({"redis": {"existingSecret": "r", "insecureDemoUrl": "redis://h"}}, "not both"),
        # one credential for both, as before the split: the Job needs the owner's
        ({"database": {"existingSecret": "pg"}}, "set migration.database.existingSecret"),
        ({"database": {"insecureDemoUrl": "postgres://u:p@h/d"}}, "set migration.database.existingSecret"),
        (
            {"database": {"existingSecret": "pg"}, "migration": {"database": {"existingSecret": "pg"}}},
            "same Secret key (pg/url)",
        ),
        (
            {"database": {"existingSecret": "pg", "existingSecretKey": "k"},
             "migration": {"database": {"existingSecret": "pg", "existingSecretKey": "k"}}},
            "same Secret key (pg/k)",
        ),
        (
            {"database": {"insecureDemoUrl": "postgres://u:p@h/d"},
             "migration": {"database": {"insecureDemoUrl": "postgres://u:p@h/d"}}},
            "same URL",
        ),
        (
            {"database": {"existingSecret": "pg"},
             "migration": {"database": {"existingSecret": "pg-owner", "insecureDemoUrl": "postgres://o:p@h/d"}}},
            "not both",
        ),
        ({"migration": {"database": {"existingSecret": "pg-owner"}}}, "no Postgres is configured"),
        (
            {"database": {"existingSecret": "pg"}, "migration": {"database": {"existingSecret": "pg-owner"}},
             "extraEnv": [{"name": "ONCEGATE_REQUIRE_LEAST_PRIVILEGE", "value": "false"}]},
            "extraEnv must not set ONCEGATE_REQUIRE_LEAST_PRIVILEGE",
        ),
        (
            {"database": {"existingSecret": "pg"}, "migration": {"database": {"existingSecret": "pg-owner"}},
             "extraEnv": [{"name": "DATABASE_URL", "value": "postgres://h/d"}]},
            "extraEnv must not set DATABASE_URL",
        ),
        (
            {"database": {"existingSecret": "pg"}, "migration": {"database": {"existingSecret": "pg-owner"}},
             "extraEnv": [{"name": "ONCEGATE_MIGRATE_ON_START", "value": "true"}]},
            "extraEnv must not set ONCEGATE_MIGRATE_ON_START",
        ),
        (
            {"database": {"existingSecret": "pg"}, "migration": {"database": {"existingSecret": "pg-owner"}},
             "extraEnv": [{"name": "OWNER", "valueFrom": {"secretKeyRef": {"name": "pg-owner", "key": "url"}}}]},
            "extraEnv OWNER references the schema owner's credential",
        ),
    ],
)
def test_template_guards_fail_with_a_message_naming_the_value(override, complaint):
    with pytest.raises(helm.HelmRenderError, match=re.escape(complaint)):
        render_raw(override)


# --------------------------------------------------------------------------
# Kubernetes 1.30 validity


def check_service_monitor(sm: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    """ServiceMonitor is a CRD without a bundled schema: check its fields here."""
    errors = []
    allowed_top = {"apiVersion", "kind", "metadata", "spec"}
    allowed_spec = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
                    "podTargetLabels", "sampleLimit", "targetLimit", "attachMetadata"}
    allowed_endpoint = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout",
                        "honorLabels", "honorTimestamps", "relabelings", "metricRelabelings",
                        "tlsConfig", "bearerTokenSecret", "authorization", "basicAuth", "params",
                        "followRedirects", "enableHttp2", "filterRunning", "proxyUrl", "oauth2"}
    duration = re.compile(r"^(0|([0-9]+(ms|s|m|h))+)$")
    if sm["apiVersion"] != "monitoring.coreos.com/v1":
        errors.append(f"apiVersion {sm['apiVersion']}")
    if set(sm) - allowed_top:
        errors.append(f"unknown top-level fields {set(sm) - allowed_top}")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", sm["metadata"].get("name", "")):
        errors.append("metadata.name is not a DNS subdomain")
    spec = sm.get("spec", {})
    if set(spec) - allowed_spec:
        errors.append(f"unknown spec fields {set(spec) - allowed_spec}")
    match = spec.get("selector", {}).get("matchLabels") or {}
    if not match:
        errors.append("spec.selector.matchLabels is empty (would select every Service)")
    services = [s for s in of_kind(docs, "Service")
                if match.items() <= (s["metadata"].get("labels") or {}).items()]
    if len(services) != 1:
        errors.append(f"selector {match} matches {len(services)} rendered Services, want 1")
    ns = spec.get("namespaceSelector", {})
    if ns and ns.get("matchNames") != [NAMESPACE]:
        errors.append(f"namespaceSelector {ns} is not the release namespace")
    endpoints = spec.get("endpoints") or []
    if not endpoints:
        errors.append("no endpoints")
    for i, ep in enumerate(endpoints):
        if set(ep) - allowed_endpoint:
            errors.append(f"endpoints[{i}] unknown fields {set(ep) - allowed_endpoint}")
        if services and ep.get("port") not in {p.get("name") for p in services[0]["spec"]["ports"]}:
            errors.append(f"endpoints[{i}].port {ep.get('port')!r} is not a named Service port")
        if not str(ep.get("path", "/metrics")).startswith("/"):
            errors.append(f"endpoints[{i}].path must start with /")
        if ep.get("scheme", "http") not in {"http", "https"}:
            errors.append(f"endpoints[{i}].scheme {ep.get('scheme')}")
        for key in ("interval", "scrapeTimeout"):
            if key in ep and not duration.match(str(ep[key])):
                errors.append(f"endpoints[{i}].{key} {ep[key]!r} is not a duration")
    return errors


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_rendered_manifests_validate_against_kubernetes_1_30_strict(values_name):
    docs = render(values_name)
    assert docs, "nothing rendered"
    errors = []
    for doc in docs:
        where = f"{doc.get('kind')}/{doc['metadata'].get('name')}"
        if doc.get("apiVersion", "").split("/")[0] == PROMETHEUS_OPERATOR_GROUP:
            check = check_prometheus_rule(doc) if doc["kind"] == "PrometheusRule" else check_service_monitor(doc, docs)
            errors += [f"{where}: {e}" for e in check]
            continue
        if "namespace" in doc["metadata"]:
            errors.append(f"{where}: hard-codes metadata.namespace")
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{where}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{where}: {e.message}")
    assert errors == []


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_names_fit_kubernetes_limits(values_name):
    for doc in render(values_name):
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
        for _, spec in pod_specs([doc]):
            for c in all_containers(spec):
                for p in c.get("ports", []):
                    assert len(p["name"]) <= 15, p
                    assert p["containerPort"] == int(p["containerPort"])


def test_long_release_names_stay_within_63_characters():
    long = "a-very-long-release-name-for-a-grants-consumer-abcdefgh"[:53]
    rendered = chart().render(load_values("observability"), name=long, namespace=NAMESPACE,
                              is_install=True)
    for doc in parse_manifests(rendered):
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]


# --------------------------------------------------------------------------
# security


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_every_container_is_locked_down(values_name):
    docs = render(values_name)
    checked = 0
    for where, spec in pod_specs(docs):
        assert spec.get("automountServiceAccountToken") is False, where
        assert spec.get("hostNetwork") is not True and spec.get("hostPID") is not True, where
        pod_sc = spec.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, where
        assert pod_sc.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        for c in all_containers(spec):
            sc = c.get("securityContext") or {}
            who = f"{where} container {c['name']}"
            assert sc.get("runAsNonRoot") is True, who
            assert sc.get("runAsUser", 65532) != 0, who
            assert sc.get("readOnlyRootFilesystem") is True, who
            assert sc.get("allowPrivilegeEscalation") is False, who
            assert sc.get("privileged", False) is False, who
            assert sc.get("capabilities") == {"drop": ["ALL"]}, who
            assert sc.get("seccompProfile") == {"type": "RuntimeDefault"}, who
            assert c.get("resources", {}).get("requests"), f"{who} has no resource requests"
            assert c.get("resources", {}).get("limits", {}).get("memory"), f"{who} has no memory limit"
            checked += 1
    assert checked >= 2, "expected at least the consumer and the sidecar"
    if values_name in {"production", "tls", "observability", "demo"}:
        job = one(docs, "Job")
        assert [c["name"] for c in pod_spec(job)["containers"]] == ["migrate"]


def secret_findings(docs: list[dict[str, Any]]) -> list[str]:
    """Places where a credential could sit in plain text in a render."""
    findings = []
    credential_url = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^@\s]+@")
    any_store_url = re.compile(r"\b(postgres(ql)?|rediss?|redis-cluster|redis-sentinel|nats)://")
    private_key = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
    secret_env = re.compile(r"(URL|PASSWORD|TOKEN|SECRET|CREDENTIALS)$")
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "Secret":
            findings.append(f"{where}: a Secret rendered with its data")
        text = json.dumps(doc)
        for pattern in (credential_url, any_store_url, private_key):
            if pattern.search(text):
                findings.append(f"{where}: matches {pattern.pattern}")
        for _, spec in pod_specs([doc]):
            for c in all_containers(spec):
                for name, e in env_of(c).items():
                    if secret_env.search(name) and "value" in e:
                        findings.append(f"{where} {c['name']}: env {name} has a plain value")
                    if name in {"DATABASE_URL", "REDIS_URL"} and "secretKeyRef" not in e.get("valueFrom", {}):
                        findings.append(f"{where} {c['name']}: {name} is not a secretKeyRef")
                    if name == "ONCEGATE_RELAY_SINK" and "value" in e and e["value"] not in {"none", "log"}:
                        findings.append(f"{where} {c['name']}: relay sink URL in plain text")
    return findings


def test_production_render_has_no_secret_in_plain_text():
    docs = render("production")
    assert secret_findings(docs) == []
    # the URLs come from the operator's Secrets, by reference
    refs = {}
    for where, spec in pod_specs(docs):
        for c in all_containers(spec):
            for name, e in env_of(c).items():
                if "secretKeyRef" in e.get("valueFrom", {}):
                    refs.setdefault(name, set()).add(
                        (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"]))
    assert refs["DATABASE_URL"] == {("oncegate-postgres", "database-url"),
                                    ("oncegate-postgres-owner", "database-url")}
    assert refs["REDIS_URL"] == {("oncegate-redis", "redis-url")}
    assert refs["ONCEGATE_RELAY_SINK"] == {("oncegate-relay", "sink-url")}


def test_the_plaintext_check_catches_demo_urls():
    """The detector above is not vacuous: the demo render (plain URLs chosen on
    purpose) trips it, and its URLs end up only in the chart's demo Secret."""
    docs = render("demo")
    findings = secret_findings(docs)
    assert any("Secret" in f for f in findings)
    secrets = {s["metadata"]["name"]: s for s in of_kind(docs, "Secret")}
    app_secret, owner_secret = secrets[f"{RELEASE}-oncegate-demo-urls"], secrets[f"{RELEASE}-oncegate-demo-owner-url"]
    assert len(secrets) == 2
    for secret in secrets.values():
        assert secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "demo-password" in app_secret["stringData"]["database-url"]
    assert "demo-owner-password" in owner_secret["stringData"]["database-url"]
    assert "demo-owner-password" not in json.dumps(app_secret), "the owner's URL has a Secret of its own"
    for d in docs:
        if d["kind"] != "Secret":
            assert "demo-password" not in json.dumps(d), d["kind"]
            assert "demo-owner-password" not in json.dumps(d), d["kind"]
    _, sidecar = deployment_sidecar(docs)
    ref = env_of(sidecar)["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": app_secret["metadata"]["name"], "key": "database-url"}
    job_ref = env_of(pod_spec(one(docs, "Job"))["containers"][0])["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert job_ref == {"name": owner_secret["metadata"]["name"], "key": "database-url"}
    assert "demo" in notes("demo").lower() and "plain text" in notes("demo")


# --------------------------------------------------------------------------
# the sidecar's runtime contract


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_probes_are_grpc_probes_on_the_health_port(values_name):
    _, sidecar = deployment_sidecar(render(values_name))
    env = env_of(sidecar)
    health = env["ONCEGATE_HEALTH_LISTEN"]["value"]
    gate = env["ONCEGATE_LISTEN"]["value"]
    assert host_of(health) in {"0.0.0.0", "::"}, "kubelet probes hit the pod IP"
    assert port_of(health) != port_of(gate) and port_of(health) != port_of(env["ONCEGATE_METRICS_LISTEN"]["value"])
    named = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert named["og-health"] == port_of(health)
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = sidecar[kind]
        handlers = {"grpc", "httpGet", "tcpSocket", "exec"} & set(probe)
        assert handlers == {"grpc"}, f"{kind} uses {handlers}"
        assert probe["grpc"]["port"] == port_of(health), kind
        assert probe["grpc"].get("service", "") in {"", "oncegate.v1.Gate"}, kind
    assert sidecar["readinessProbe"]["grpc"]["service"] == "oncegate.v1.Gate"
    startup = sidecar["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60, "startup gets a minute"


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_gate_stays_on_loopback_unless_tls(values_name):
    spec, sidecar = deployment_sidecar(render(values_name))
    env = env_of(sidecar)
    host = host_of(env["ONCEGATE_LISTEN"]["value"])
    if "ONCEGATE_TLS_CERT" not in env:
        assert host == "127.0.0.1"
        assert "og-grpc" not in {p["name"] for p in sidecar["ports"]}
    consumer = [c for c in spec["containers"] if c["name"] != "oncegate"][0]
    target = env_of(consumer)["ONCEGATE_TARGET"]["value"]
    assert target.endswith(f"127.0.0.1:{port_of(env['ONCEGATE_LISTEN']['value'])}")
    assert target.startswith("https://" if "ONCEGATE_TLS_CERT" in env else "http://")


def parse_seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)s", text)
    assert m, f"not a seconds duration: {text}"
    return int(m.group(1))


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_shutdown_lets_the_drain_finish(values_name):
    spec, sidecar = deployment_sidecar(render(values_name))
    pre_stop = sidecar["lifecycle"]["preStop"]
    assert set(pre_stop) == {"sleep"}, "native sleep handler: the image has no shell"
    grace = parse_seconds(env_of(sidecar)["ONCEGATE_SHUTDOWN_GRACE"]["value"])
    assert spec["terminationGracePeriodSeconds"] >= pre_stop["sleep"]["seconds"] + grace + 5


def test_native_sidecar_runs_as_restartable_init_container():
    spec, sidecar = deployment_sidecar(render("production"))
    assert sidecar in spec.get("initContainers", [])
    assert sidecar["restartPolicy"] == "Always"
    assert "oncegate" not in [c["name"] for c in spec["containers"]]
    assert sidecar["image"].endswith("@sha256:84a3696b63fca3c41a72f672bfb4fe8f63ea38957100463ad5927a56b784f89b")


def test_minimal_render_is_the_example_on_embedded_sqlite():
    docs = render("minimal")
    assert sorted(d["kind"] for d in docs) == ["Deployment"]
    spec, sidecar = deployment_sidecar(docs)
    assert sidecar["image"] == f"ghcr.io/oncegate/oncegate:{chart().metadata['appVersion']}"
    assert sidecar["args"] == ["serve"]
    assert sidecar not in spec.get("initContainers", [])
    env = env_of(sidecar)
    assert "DATABASE_URL" not in env and "REDIS_URL" not in env
    assert env["ONCEGATE_MIGRATE_ON_START"]["value"] == "true"
    assert env["ONCEGATE_LISTEN"]["value"] == "127.0.0.1:50051"
    assert env["ONCEGATE_HEALTH_LISTEN"]["value"] == "0.0.0.0:50052"
    assert env["ONCEGATE_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert spec["enableServiceLinks"] is False


def mounted_volume(spec: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict, dict]:
    """The (volumeMount, volume) under which `path` lives in `container`."""
    mounts = sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
    for m in mounts:
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
            volume = [v for v in spec["volumes"] if v["name"] == m["name"]]
            assert len(volume) == 1, f"volume {m['name']} not defined"
            return m, volume[0]
    raise AssertionError(f"{path} is on the read-only root filesystem of {container['name']}")


@pytest.mark.parametrize("values_name", ["minimal", "sqlite"])
def test_embedded_sqlite_lives_on_a_writable_volume(values_name):
    docs = render(values_name)
    assert of_kind(docs, "Job") == [], "no migration Job without a database"
    spec, sidecar = deployment_sidecar(docs)
    env = env_of(sidecar)
    path = env["ONCEGATE_SQLITE_PATH"]["value"]
    mount, volume = mounted_volume(spec, sidecar, path)
    assert mount["mountPath"] == str(pathlib.PurePosixPath(path).parent), "the -wal/-shm files need the directory"
    assert not mount.get("readOnly")
    assert env["ONCEGATE_MIGRATE_ON_START"]["value"] == "true"
    if values_name == "minimal":
        assert "emptyDir" in volume
    else:
        pvc = one(docs, "PersistentVolumeClaim")
        assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
        assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    mounted_volume(spec, sidecar, "/tmp/x")


@pytest.mark.parametrize("values_name", ["production", "tls", "observability"])
def test_migration_job_is_a_pre_install_pre_upgrade_hook(values_name):
    docs = render(values_name)
    job = one(docs, "Job")
    notes_ = job["metadata"]["annotations"]
    assert set(notes_["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in notes_["helm.sh/hook-delete-policy"]
    spec = pod_spec(job)
    assert spec["restartPolicy"] == "Never"
    migrate = spec["containers"][0]
    assert migrate["args"] == ["migrate"]
    _, sidecar = deployment_sidecar(docs)
    assert migrate["image"] == sidecar["image"]
    owner, app = owner_credential(load_values(values_name)), app_credential(load_values(values_name))
    assert secret_key_ref(env_of(migrate)["DATABASE_URL"]) == owner, "the Job migrates as the owner"
    assert secret_key_ref(env_of(sidecar)["DATABASE_URL"]) == app, "the sidecar runs as the application role"
    assert owner != app
    assert env_of(sidecar)["ONCEGATE_MIGRATE_ON_START"]["value"] == "false"
    mounted_volume(spec, migrate, "/tmp/x")


def test_tls_certificates_come_from_a_mounted_secret():
    docs = render("tls")
    spec, sidecar = deployment_sidecar(docs)
    env = env_of(sidecar)
    assert host_of(env["ONCEGATE_LISTEN"]["value"]) == "0.0.0.0"
    for name, file in [("ONCEGATE_TLS_CERT", "tls.crt"), ("ONCEGATE_TLS_KEY", "tls.key"),
                       ("ONCEGATE_TLS_CLIENT_CA", "ca.crt")]:
        path = env[name]["value"]
        assert path.endswith("/" + file)
        mount, volume = mounted_volume(spec, sidecar, path)
        assert mount["readOnly"] is True
        assert volume["secret"]["secretName"] == "oncegate-tls"
        assert volume["secret"]["defaultMode"] & 0o007 == 0, "key not world-readable"
    assert spec["securityContext"]["fsGroup"] == 65532, "0440 files are read through fsGroup"
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]}["og-grpc"] == 50051
    # probes stay on the plaintext health listener
    assert sidecar["readinessProbe"]["grpc"]["port"] == port_of(env["ONCEGATE_HEALTH_LISTEN"]["value"])


def test_tls_off_sets_no_tls_settings():
    _, sidecar = deployment_sidecar(render("production"))
    assert not {k for k in env_of(sidecar) if k.startswith("ONCEGATE_TLS")}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def test_metrics_service_monitor_pdb_and_network_policy():
    docs = render("observability")
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    spec, sidecar = deployment_sidecar(docs)

    service = one(docs, "Service")
    assert matches(service["spec"]["selector"], pod_labels)
    container_ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in container_ports and port["targetPort"] == "og-metrics"
    assert container_ports["og-metrics"] == port_of(env_of(sidecar)["ONCEGATE_METRICS_LISTEN"]["value"])
    assert host_of(env_of(sidecar)["ONCEGATE_METRICS_LISTEN"]["value"]) == "0.0.0.0"

    sm = one(docs, "ServiceMonitor")
    assert check_service_monitor(sm, docs) == []
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"

    pdb = one(docs, "PodDisruptionBudget")
    assert matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["minAvailable"] == 1 and "maxUnavailable" not in pdb["spec"]
    job_labels = one(docs, "Job")["spec"]["template"]["metadata"]["labels"]
    assert not matches(pdb["spec"]["selector"]["matchLabels"], job_labels)
    assert not matches(service["spec"]["selector"], job_labels)

    np = one(docs, "NetworkPolicy")
    assert matches(np["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ingress_ports = {p["port"] for rule in np["spec"]["ingress"] for p in rule.get("ports", [])}
    assert ingress_ports == {50052, 9464}, "the loopback Gate port is not opened"
    metrics_rule = [r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == 9464][0]
    assert metrics_rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"}


def test_optional_resources_are_off_by_default():
    kinds = {d["kind"] for d in render("production")}
    assert not kinds & {"Service", "ServiceMonitor", "PodDisruptionBudget", "NetworkPolicy", "Secret",
                        "ConfigMap", "PrometheusRule"}


@pytest.mark.parametrize("values_name", VALUES_FILES)
def test_notes_tell_the_operator_how_to_check(values_name):
    text = notes(values_name)
    assert "rollout status" in text
    assert "grpc.health.v1.Health/Check" in text
    assert "/metrics" in text


# --------------------------------------------------------------------------
# two database credentials: the schema owner's (migration.database) for the
# migration Job only, the application role's (database) for the sidecar only

POSTGRES_VALUES = [n for n in VALUES_FILES if n not in {"minimal", "sqlite"}]
TWO_CREDENTIALS = {
    "database": {"existingSecret": "ledger-app", "existingSecretKey": "dsn"},
    "migration": {"database": {"existingSecret": "ledger-owner", "existingSecretKey": "dsn"},
                  "appRole": "ledger_app"},
}


def secret_key_ref(env_var: dict[str, Any]) -> tuple[str, str]:
    ref = env_var["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def demo_secret(suffix: str) -> str:
    return f"{RELEASE}-oncegate-{suffix}"


def owner_credential(values: dict[str, Any]) -> tuple[str, str] | None:
    """(Secret, key) of the schema owner's URL that these values configure."""
    db = (values.get("migration") or {}).get("database") or {}
    if db.get("existingSecret"):
        return db["existingSecret"], db.get("existingSecretKey", "url")
    if db.get("insecureDemoUrl"):
        return demo_secret("demo-owner-url"), "database-url"
    return None


def app_credential(values: dict[str, Any]) -> tuple[str, str] | None:
    db = values.get("database") or {}
    if db.get("existingSecret"):
        return db["existingSecret"], db.get("existingSecretKey", "url")
    if db.get("insecureDemoUrl"):
        return demo_secret("demo-urls"), "database-url"
    return None


def secret_references(spec: dict[str, Any]) -> Iterator[tuple[str, str, str | None]]:
    """(where, Secret, key or None for the whole Secret) of every Secret a pod spec can read."""
    for c in all_containers(spec):
        for e in c.get("env", []):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                yield f"{c['name']} env {e['name']}", ref["name"], ref["key"]
        for src in c.get("envFrom", []):
            if "secretRef" in src:
                yield f"{c['name']} envFrom", src["secretRef"]["name"], None
    for v in spec.get("volumes", []):
        if "secret" in v:
            yield f"volume {v['name']}", v["secret"]["secretName"], None
        for src in (v.get("projected") or {}).get("sources", []):
            if "secret" in src:
                yield f"volume {v['name']}", src["secret"]["name"], None


def owner_leaks(docs: list[dict[str, Any]], owner: tuple[str, str]) -> list[str]:
    """Every place outside the migration Job that could read the owner's URL."""
    leaks = []
    for where, spec in pod_specs(docs):
        if where.startswith("Job/"):
            continue
        for what, name, key in secret_references(spec):
            if name == owner[0] and key in {None, owner[1]}:
                leaks.append(f"{where} {what}: {name}/{key or '*'}")
    return leaks


INLINE_TWO_CREDENTIALS = {
    "inline": TWO_CREDENTIALS,
    "inline-native": {**TWO_CREDENTIALS, "nativeSidecar": True},
    "inline-tls": {**TWO_CREDENTIALS, "gate": {"bindAddress": "0.0.0.0"},
                   "tls": {"enabled": True, "secretName": "t"}},
}
TWO_CREDENTIAL_CASES = POSTGRES_VALUES + list(INLINE_TWO_CREDENTIALS)


def two_credential_render(label: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(manifests, values) of a values file with Postgres, or of an inline case."""
    if label in INLINE_TWO_CREDENTIALS:
        values = INLINE_TWO_CREDENTIALS[label]
        return parse_manifests(render_raw(values)), values
    return render(label), load_values(label)


def test_every_postgres_values_file_keeps_two_credentials():
    assert {"production", "tls", "observability", "demo"} <= set(POSTGRES_VALUES)
    for name in POSTGRES_VALUES:
        values = load_values(name)
        owner, app = owner_credential(values), app_credential(values)
        assert app, name
        if (values.get("migration") or {}).get("enabled", True):
            assert owner and owner != app, name


@pytest.mark.parametrize("label", TWO_CREDENTIAL_CASES)
def test_the_owner_credential_reaches_only_the_migration_job(label):
    docs, values = two_credential_render(label)
    owner, app = owner_credential(values), app_credential(values)
    spec, sidecar = deployment_sidecar(docs)
    assert secret_key_ref(env_of(sidecar)["DATABASE_URL"]) == app
    if owner is None:
        assert of_kind(docs, "Job") == [], "no Job without the owner's credential"
        return
    assert owner_leaks(docs, owner) == []
    if owner[0] != app[0]:
        for where, other in pod_specs(docs):
            if not where.startswith("Job/"):
                assert owner[0] not in json.dumps(other), f"{where} names the owner's Secret"
    job = pod_spec(one(docs, "Job"))
    (migrate,) = job["containers"]
    env = env_of(migrate)
    assert secret_key_ref(env["DATABASE_URL"]) == owner
    refs = {(name, key) for _, name, key in secret_references(job)}
    assert refs == {owner}, "the Job reads the owner's URL and nothing else (never the app role's)"
    assert app not in refs
    want_role = (values.get("migration") or {}).get("appRole", "oncegate_app")
    assert env["ONCEGATE_APP_ROLE"] == {"name": "ONCEGATE_APP_ROLE", "value": want_role}
    assert "ONCEGATE_REQUIRE_LEAST_PRIVILEGE" not in env, "the owner is privileged by design"


@pytest.mark.parametrize("label", TWO_CREDENTIAL_CASES)
def test_with_postgres_the_sidecar_requires_least_privilege_and_never_migrates(label):
    docs, _ = two_credential_render(label)
    _, sidecar = deployment_sidecar(docs)
    env = env_of(sidecar)
    assert env["ONCEGATE_REQUIRE_LEAST_PRIVILEGE"] == {"name": "ONCEGATE_REQUIRE_LEAST_PRIVILEGE", "value": "true"}
    assert env["ONCEGATE_MIGRATE_ON_START"]["value"] == "false"
    assert "ONCEGATE_APP_ROLE" not in env


@pytest.mark.parametrize("values_name", ["minimal", "sqlite"])
def test_sqlite_sidecar_migrates_its_own_file_and_has_no_privilege_check(values_name):
    env = env_of(deployment_sidecar(render(values_name))[1])
    assert env["ONCEGATE_MIGRATE_ON_START"]["value"] == "true"
    assert "ONCEGATE_REQUIRE_LEAST_PRIVILEGE" not in env


def test_external_migrations_render_no_job_and_no_owner_credential():
    docs = render("external-migrations")
    assert of_kind(docs, "Job") == []
    env = env_of(deployment_sidecar(docs)[1])
    assert env["ONCEGATE_MIGRATE_ON_START"]["value"] == "false", "the app role cannot migrate"
    assert env["ONCEGATE_REQUIRE_LEAST_PRIVILEGE"]["value"] == "true"
    text = notes("external-migrations")
    assert "oncegate migrate" in text and "schema owner" in text


def test_app_role_empty_means_no_grants_by_the_job():
    values = {**TWO_CREDENTIALS, "migration": {**TWO_CREDENTIALS["migration"], "appRole": ""}}
    job = one(parse_manifests(render_raw(values)), "Job")
    assert "ONCEGATE_APP_ROLE" not in env_of(pod_spec(job)["containers"][0])


def test_owner_leak_check_is_not_vacuous():
    """The check above would notice the owner's URL in any container of a
    non-Job pod: here the consumer's own env asks for it."""
    values = {**TWO_CREDENTIALS,
              "example": {"app": {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "ledger-owner", "key": "dsn"}}}]}}}
    docs = parse_manifests(render_raw(values))
    assert owner_leaks(docs, ("ledger-owner", "dsn")) == [f"Deployment/{RELEASE}-oncegate consumer env X: ledger-owner/dsn"]


# --------------------------------------------------------------------------
# the two-line include from another chart, exactly as README.md documents it

README = CHART / "README.md"


def readme_block(marker: str) -> str:
    text = README.read_text()
    m = re.search(re.escape(f"<!-- {marker} -->") + r"\s*```[a-z]*\n(.*?)```", text, re.S)
    assert m, f"README.md lacks the code block marked <!-- {marker} -->"
    return m.group(1)


def test_sidecar_include_from_a_parent_chart(tmp_path):
    parent = tmp_path / "grants-consumer"
    (parent / "templates").mkdir(parents=True)
    (parent / "charts").mkdir()
    shutil.copytree(CHART, parent / "charts" / "oncegate")
    (parent / "Chart.yaml").write_text(readme_block("parent-chart-yaml"))
    (parent / "values.yaml").write_text(readme_block("parent-values"))
    deployment_tpl = readme_block("parent-deployment")
    include_lines = [line for line in deployment_tpl.splitlines() if 'include "oncegate.' in line]
    assert len(include_lines) == 2, include_lines
    (parent / "templates" / "deployment.yaml").write_text(deployment_tpl)

    with helm.Chart.load(parent) as parent_chart:
        report = helm.lint(parent, strict=True, kube_version="v1.30.0", namespace=NAMESPACE)
        assert report["errors"] == [], report
        docs = parse_manifests(render_raw({}, parent_chart))

    deployments = of_kind(docs, "Deployment")
    assert len(deployments) == 1, "the subchart's example is disabled; only the parent's Deployment"
    spec = pod_spec(deployments[0])
    sidecar = sidecar_of(spec)
    env = env_of(sidecar)
    # the parent's `oncegate:` values reach the sidecar
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "grants-postgres"
    assert env["ONCEGATE_MIGRATE_ON_START"]["value"] == "false"
    assert env["ONCEGATE_REQUIRE_LEAST_PRIVILEGE"]["value"] == "true"
    # the owner's Secret reaches the subchart's Job and nothing else
    owner = ("grants-postgres-owner", "url")
    assert owner_leaks(docs, owner) == []
    job_env = env_of(pod_spec(one(docs, "Job"))["containers"][0])
    assert secret_key_ref(job_env["DATABASE_URL"]) == owner
    assert job_env["ONCEGATE_APP_ROLE"]["value"] == "oncegate_app"
    # the image follows oncegate's appVersion, not the parent's
    assert sidecar["image"] == f"ghcr.io/oncegate/oncegate:{chart().metadata['appVersion']}"
    for m in sidecar["volumeMounts"]:
        assert m["name"] in {v["name"] for v in spec["volumes"]}
    assert spec["terminationGracePeriodSeconds"] >= 30
    assert one(docs, "Job")["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


# --------------------------------------------------------------------------
# documentation and image


def documented_value_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    """Leaf paths of the values: descend where the schema lists properties."""
    paths = []
    for key, node in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if "properties" in node:
            paths += documented_value_paths(node, path + ".")
        else:
            paths.append(path)
    return paths


def test_readme_documents_every_value():
    text = README.read_text()
    table_keys = set(re.findall(r"^\| `([^`]+)` \|", text, re.M))
    paths = [p for p in documented_value_paths(chart().schema) if p != "global"]
    assert sorted(set(paths) - table_keys) == []
    assert sorted(table_keys - set(paths)) == [], "README documents values that do not exist"


def test_every_value_has_a_default_in_values_yaml():
    """values.yaml spells out every value the schema knows (and the closed
    schema rejects any it does not), so values.yaml is a complete reference."""
    missing = []

    def walk(node: dict[str, Any], values: dict[str, Any], prefix: str) -> None:
        for key, child in node.get("properties", {}).items():
            if key not in values:
                missing.append(prefix + key)
            elif "properties" in child:
                walk(child, values[key], f"{prefix}{key}.")

    schema = dict(chart().schema)
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k != "global"}
    walk(schema, chart().values, "")
    assert missing == []


def test_dockerfile_builds_locked_release_into_a_nonroot_minimal_image():
    text = (REPO / "Dockerfile").read_text()
    # The bases are build arguments whose defaults are the public images.
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    stages = [
        (re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image), name.lower())
        for image, name in re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    ]
    assert len(stages) >= 2, "multi-stage"
    assert stages[0] == ("rust:1.95-bookworm", "builder")
    assert re.search(r"cargo build --release --locked", text)
    runtime = dict((name, image) for image, name in stages)["runtime"]
    assert runtime == "gcr.io/distroless/cc-debian12:nonroot"
    body = text[text.index("AS runtime"):text.index("AS prebuilt")]
    assert re.search(r'^USER\s+(nonroot|65532)', body, re.M)
    assert re.search(r'^ENTRYPOINT \["/oncegate"\]$', body, re.M)
    assert re.search(r'^CMD \["serve"\]$', body, re.M)
    # The default (last) stage is the runtime with the builder's binary; the
    # prebuilt target (scripts/image) takes a binary from its context instead.
    assert stages[-1] == ("runtime", "")
    assert re.search(r"^COPY --from=builder /out/oncegate /oncegate$", text[text.rfind("\nFROM"):], re.M)
    assert ("runtime", "prebuilt") in stages
    assert "ONCEGATE_LISTEN" not in re.sub(r"#.*", "", text), "the listen default stays loopback"
    # librdkafka's zlib is linked statically: the distroless cc base has no libz.so.1
    cargo = (REPO / "Cargo.toml").read_text()
    assert re.search(r'^rdkafka = \{.*"libz-static"', cargo, re.M)
    ignore = (REPO / ".dockerignore").read_text().split()
    for entry in ("target", ".git", "bench/results", "clients/python/.venv", ".venv-chart", ".testenv"):
        assert any(line.strip("/") in {entry, entry + "/", "**/" + entry} for line in ignore), entry


# --------------------------------------------------------------------------
# the Grafana dashboard and the alert rules, against what the binary exports

DASHBOARD_FILE = CHART / "dashboards" / "oncegate.json"
METRICS_RS = REPO / "src" / "metrics.rs"
# Labels Prometheus adds to every series it scrapes through the ServiceMonitor.
TARGET_LABELS = {"namespace", "pod", "job", "instance", "service", "container", "endpoint"}
PROMQL_WORDS = {
    # aggregations and their modifiers
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "and", "or", "unless", "offset",
    # functions used here (any other name would be taken for a metric and fail)
    "rate", "irate", "increase", "delta", "histogram_quantile", "min_over_time", "max_over_time",
    "avg_over_time", "time", "absent", "clamp_min", "label_values",
}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: every identifier that is not a
    PromQL word, a label name, a string, a number or a Grafana variable."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\blabel_values\((.*),\s*\w+\s*\)", r"\1", expr)  # Grafana: label_values(metric, label)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\boffset\s+-?[0-9a-z]+", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", "", expr)
    return {t for t in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr) if t not in PROMQL_WORDS}


def promql_matcher_labels(expr: str) -> dict[str, set[str]]:
    """metric name -> the label names its `{…}` matchers use."""
    expr = re.sub(r"\$\{?\w+\}?", "X", expr)
    found: dict[str, set[str]] = {}
    for name, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
        found.setdefault(name, set()).update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return found


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def rule_exprs(rule: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def described_metrics() -> dict[str, str]:
    """name -> counter | gauge | histogram, as src/metrics.rs describes them."""
    text = METRICS_RS.read_text()
    return {n: k for k, n in re.findall(r'describe_(counter|gauge|histogram)!\(\s*"([a-z0-9_]+)"', text)}


def emitted_metrics() -> dict[str, str]:
    """name -> kind of every metric the code records."""
    found = {}
    for path in (REPO / "src").rglob("*.rs"):
        for kind, name in re.findall(r'metrics::(counter|gauge|histogram)!\(\s*"([a-z0-9_]+)"', path.read_text()):
            found[name] = kind
    return found


def series_base(name: str, described: dict[str, str]) -> str:
    """A histogram's `_bucket`/`_sum`/`_count` series -> the histogram's name."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and described.get(name[: -len(suffix)]) == "histogram":
            return name[: -len(suffix)]
    return name


def check_prometheus_rule(rule: dict[str, Any]) -> list[str]:
    """PrometheusRule is a CRD without a bundled schema: check its fields here."""
    errors = []
    if rule["apiVersion"] != "monitoring.coreos.com/v1":
        errors.append(f"apiVersion {rule['apiVersion']}")
    if set(rule) - {"apiVersion", "kind", "metadata", "spec"}:
        errors.append(f"unknown top-level fields {set(rule) - {'apiVersion', 'kind', 'metadata', 'spec'}}")
    duration = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
    groups = rule.get("spec", {}).get("groups") or []
    if not groups or set(rule["spec"]) - {"groups"}:
        errors.append("spec must hold groups only")
    for g in groups:
        if set(g) - {"name", "interval", "rules", "partial_response_strategy", "limit"} or not g.get("name"):
            errors.append(f"group {g.get('name')!r}: bad fields {sorted(g)}")
        for r in g.get("rules") or []:
            name = r.get("alert") or r.get("record")
            if set(r) - {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}:
                errors.append(f"{name}: unknown fields {set(r) - {'alert', 'expr', 'for', 'labels', 'annotations'}}")
            if not isinstance(r.get("expr"), str) or r["expr"].count("(") != r["expr"].count(")"):
                errors.append(f"{name}: expr is not a balanced expression")
            if "for" in r and not duration.match(str(r["for"])):
                errors.append(f"{name}: for {r['for']!r} is not a duration")
            for key, value in {**r.get("labels", {}), **r.get("annotations", {})}.items():
                if not isinstance(value, str):
                    errors.append(f"{name}: {key} is not a string")
    return errors


def test_dashboard_is_a_configmap_for_the_grafana_sidecar():
    docs = render("observability")
    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "oncegate"}
    board = json.loads(cm["data"]["oncegate.json"])
    assert board == dashboard(), "the ConfigMap carries dashboards/oncegate.json as it is"
    assert len(cm["data"]["oncegate.json"]) < 256 * 1024, "fits kubectl's last-applied annotation"
    assert board["uid"] == "oncegate" and board["title"] == "oncegate"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    ids, cells = set(), set()
    for p in board["panels"]:
        assert p["id"] not in ids, f"panel id {p['id']} twice"
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another"
                cells.add((x, y))
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
            assert p.get("description"), f"panel {p['title']!r} says what it shows"
            for t in p["targets"]:
                assert 'namespace=~"$namespace"' in t["expr"] or t["expr"].startswith("time() - max("), t["expr"]
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for topic in ("decisions by outcome and tier", "latency", "tier hit ratio", "breaker", "group-commit batch size",
                  "outbox backlog", "oldest unpublished", "quarantined", "purge", "reconciliation"):
        assert topic in titles, f"a panel for {topic}"


def test_every_alert_points_at_its_runbook():
    """runbook_url is the alert's section of docs/OPERATING.md: the base value +
    "#" + the name in lower case, GitHub's anchor for the heading `### Name`
    (the Rust suite's structure::docs checks each heading is there)."""
    default = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"]
    assert default.endswith("/docs/OPERATING.md"), default
    values = load_values("observability")
    for base in (default, "https://docs.example.org/oncegate/OPERATING.md"):
        values["prometheusRule"]["runbookBaseUrl"] = base
        rule = one(parse_manifests(render_raw(values)), "PrometheusRule")
        alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
        assert len(alerts) >= 10
        for r in alerts:
            assert r["annotations"].get("runbook_url") == f"{base}#{r['alert'].lower()}", r["alert"]
    values["prometheusRule"]["runbookBaseUrl"] = ""
    rule = one(parse_manifests(render_raw(values)), "PrometheusRule")
    assert all("runbook_url" not in r["annotations"] for g in rule["spec"]["groups"] for r in g["rules"])


def test_prometheus_rule_alerts_on_what_an_operator_must_act_on():
    docs = render("observability")
    rule = one(docs, "PrometheusRule")
    assert check_prometheus_rule(rule) == []
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    for alert in ("OncegateOutboxEventsWaiting", "OncegateOutboxEventsQuarantined", "OncegateRedisBreakerOpen",
                  "OncegateRelayBrokerUnreachable", "OncegateAuditRowsDropped", "OncegateReconciliationMismatch",
                  "OncegatePurgeLagging", "OncegatePrivilegedDatabaseRole", "OncegateReconciliationStale",
                  "OncegateNoSynchronousStandby"):
        r = rules[alert]
        assert f'namespace="{NAMESPACE}"' in r["expr"], f"{alert} is scoped to the release"
        assert r["labels"]["severity"] in {"warning", "critical"}, alert
        assert r["annotations"]["summary"] and r["annotations"]["description"], alert
        assert "{{" not in r["expr"], f"{alert}: Helm left a template in the expression"
    assert rules["OncegateOutboxEventsWaiting"]["expr"].endswith("> 600"), "the threshold is a value"
    assert "[10m]" in rules["OncegateRedisBreakerOpen"]["expr"]
    assert "{{ $value | humanizeDuration }}" in rules["OncegateOutboxEventsWaiting"]["annotations"]["description"]
    assert "oncegate outbox retry" in rules["OncegateOutboxEventsQuarantined"]["annotations"]["description"]
    assert "oncegate reconcile" in rules["OncegateReconciliationMismatch"]["annotations"]["description"]


def test_the_metric_name_check_is_not_vacuous():
    expr = ('histogram_quantile(0.99, sum by (le, method) (rate(oncegate_request_duration_seconds_bucket'
            '{namespace=~"$namespace", result="ok"}[$__rate_interval]))) / on (pod) up offset 5m > 1e3')
    assert promql_metric_names(expr) == {"oncegate_request_duration_seconds_bucket", "up"}
    assert promql_metric_names('label_values(oncegate_decisions_total{a="b"}, pod)') == {"oncegate_decisions_total"}
    assert promql_matcher_labels(expr) == {"oncegate_request_duration_seconds_bucket": {"namespace", "result"}}


def test_every_metric_the_code_sets_is_described_and_nothing_more():
    assert emitted_metrics() == described_metrics()


# Metrics the panels and rules use that the scraped sidecar below cannot
# produce: a failure or a Postgres store is needed. Each is in src/metrics.rs.
NOT_SCRAPED_HERE = {
    "oncegate_audit_dropped_total": "a full audit queue or a store down at shutdown",
    "oncegate_db_role_privileged": "Postgres only",
    "oncegate_db_pool_connections": "Postgres only",
    "oncegate_db_connections_held": "Postgres only",
    "oncegate_outbox_publish_errors_total": "a broker refusing or unreachable",
    "oncegate_outbox_quarantined_total": "a broker refusing an event max-attempts times",
    "oncegate_tier_errors_total": "a failing tier",
    "oncegate_group_commit_fallbacks_total": "a batch failing on a lock",
    "oncegate_redis_breaker_state": "Redis (driven too when one answers on 127.0.0.1:6379)",
    "oncegate_sync_standby_shortfall": "Postgres with ONCEGATE_REQUIRE_SYNC_REPLICA (test_alerts.py drives it live)",
    "oncegate_relay_outage": "a relay paused by an outage",
}


def free_port() -> int:
    """A free loopback port drawn below the kernel's ephemeral range
    (32768-60999) and checked by binding it: one the kernel hands out for
    bind(0) or an outgoing connection can be taken again by any socket before
    the server we start binds it, or while a server the test restarts on the
    same port is down."""
    import random
    import socket
    while True:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def reachable(host: str, port: int) -> bool:
    import socket
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def scrape(port: int) -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory) -> tuple[dict[str, str], dict[str, set[str]], bool]:
    """A real sidecar (SQLite, log relay sink, Redis when one answers), driven
    with a fresh claim, a duplicate and an invalid submission, with the purge and
    reconcile running: (name -> TYPE, name -> label names, Redis used)."""
    import os
    import subprocess
    import time
    import uuid

    binary = pathlib.Path(os.environ.get("ONCEGATE_BIN", REPO / "target" / "debug" / "oncegate"))
    assert binary.exists(), f"{binary} is missing: build it first (cargo build), or set ONCEGATE_BIN"
    tmp = tmp_path_factory.mktemp("sidecar")
    grpc, metrics = free_port(), free_port()
    env = {"PATH": os.environ.get("PATH", ""), "ONCEGATE_SQLITE_PATH": str(tmp / "oncegate.db"),
           "ONCEGATE_LISTEN": f"127.0.0.1:{grpc}", "ONCEGATE_METRICS_LISTEN": f"127.0.0.1:{metrics}",
           "ONCEGATE_RELAY_SINK": "log", "ONCEGATE_RELAY_POLL": "100ms", "ONCEGATE_RECONCILE_INTERVAL": "200ms",
           "ONCEGATE_PURGE_INTERVAL": "1s", "ONCEGATE_AUDIT_FLUSH_INTERVAL": "100ms", "RUST_LOG": "warn"}
    redis = reachable("127.0.0.1", 6379)
    if redis:
        env |= {"REDIS_URL": "redis://127.0.0.1:6379", "ONCEGATE_REDIS_KEY_PREFIX": f"og-chart-{uuid.uuid4().hex}:"}
    log = open(tmp / "sidecar.log", "w")
    proc = subprocess.Popen([str(binary), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        submit = [str(binary), "submit", "--target", f"http://127.0.0.1:{grpc}", "--award-id", "AWD-CHART",
                  "--timestamp", "2026-12-01T09:00:00Z", "--payload", "chart"]
        deadline = time.time() + 20
        while subprocess.run(submit + ["--amount-cents", "100"], capture_output=True).returncode != 0:
            assert time.time() < deadline and proc.poll() is None, (tmp / "sidecar.log").read_text()
            time.sleep(0.2)
        subprocess.run(submit + ["--amount-cents", "100"], check=True, capture_output=True)
        subprocess.run(submit + ["--amount-cents", "0"], capture_output=True)
        needed = ["oncegate_reconciliation_last_run_timestamp_seconds", "oncegate_outbox_backlog",
                  "oncegate_purge_lag_seconds", "oncegate_audit_written_total"]
        while True:
            text = scrape(metrics)
            if all(f"\n{n}" in text or text.startswith(n) for n in needed):
                break
            assert time.time() < deadline + 10, text
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    described = described_metrics()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    labels: dict[str, set[str]] = {}
    for name, body in re.findall(r"^([a-z_:][a-z0-9_:]*)(?:\{([^}]*)\})? ", text, re.M):
        labels.setdefault(series_base(name, described), set()).update(re.findall(r'(\w+)="', body or ""))
    return types, labels, redis


def test_dashboard_and_rules_use_only_metrics_the_binary_exports(scraped):
    types, labels, redis = scraped
    described = described_metrics()
    assert {n: types[n] for n in types} == {n: described.get(n) for n in types}, \
        "every exported metric is described in src/metrics.rs, with its type"
    docs = render("observability")
    exprs = dashboard_exprs(dashboard()) + rule_exprs(one(docs, "PrometheusRule"))
    used: set[str] = set()
    for expr in exprs:
        names = {series_base(n, described) for n in promql_metric_names(expr)}
        unknown = sorted(n for n in names if n not in described)
        assert unknown == [], f"{expr}: not exported by the binary: {unknown}"
        used |= names
        for name, keys in promql_matcher_labels(expr).items():
            base = series_base(name, described)
            if base in labels:
                assert keys - TARGET_LABELS <= labels[base], f"{expr}: {base} has no label {keys - labels[base]}"
    not_here = set(NOT_SCRAPED_HERE) - ({"oncegate_redis_breaker_state"} if redis else set())
    assert sorted(used - set(types) - not_here) == [], "used, and not scraped from the running sidecar"
    assert used >= {"oncegate_decisions_total", "oncegate_request_duration_seconds", "oncegate_tier_lookups_total",
                    "oncegate_group_commit_batch_size", "oncegate_outbox_backlog", "oncegate_outbox_oldest_age_seconds",
                    "oncegate_outbox_quarantined", "oncegate_purge_lag_seconds", "oncegate_purge_deleted_total",
                    "oncegate_reconciliation_mismatches", "oncegate_redis_breaker_state",
                    "oncegate_relay_breaker_state", "oncegate_audit_dropped_total", "oncegate_db_role_privileged"}
    for name in ("oncegate_decisions_total", "oncegate_reconciliation_mismatches", "oncegate_tier_lookups_total"):
        assert name in types, f"{name} was scraped from the driven sidecar"
    assert {"outcome", "tier"} <= labels["oncegate_decisions_total"]
    assert labels["oncegate_reconciliation_mismatches"] == {"check"}


def test_kafka_sink_settings_reach_the_sidecar_only():
    values = load_values("production")
    values["relay"].update(existingSecret="oncegate-kafka", existingSecretKey="url")
    values["relay"]["kafka"] = {"tlsSecret": "kafka-client-tls", "mountPath": "/etc/oncegate/kafka",
                                "transactionalIdPrefix": "grants-relay-"}
    docs = parse_manifests(render_raw(values))
    spec, sidecar = deployment_sidecar(docs)
    env = env_of(sidecar)
    # The URL (with any sasl.password in its query) only ever from the Secret.
    assert env["ONCEGATE_RELAY_SINK"]["valueFrom"]["secretKeyRef"] == {"name": "oncegate-kafka", "key": "url"}
    # The slot owns the transactional id (prefix + slot), never the pod.
    assert env["ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX"]["value"] == "grants-relay-"
    assert "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID" not in env, "the per-pod id is gone"
    assert env["ONCEGATE_RELAY_SLOTS"]["value"] == "8"
    mount, volume = mounted_volume(spec, sidecar, "/etc/oncegate/kafka/ca.crt")
    assert mount["readOnly"] is True
    assert volume["secret"]["secretName"] == "kafka-client-tls"
    assert volume["secret"]["defaultMode"] & 0o007 == 0
    for job in of_kind(docs, "Job"):
        for c in all_containers(pod_spec(job)):
            assert "ONCEGATE_RELAY_SINK" not in env_of(c), "the migration Job never sees the broker"
            assert not any(m["name"] == "oncegate-kafka-tls" for m in c.get("volumeMounts", []))
    # Without the prefix the binary's default (oncegate-relay-) holds.
    plain = parse_manifests(render_raw(load_values("production")))
    assert "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX" not in env_of(deployment_sidecar(plain)[1])


def _sidecar(values: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The oncegate container and the pod's volumes."""
    docs = parse_manifests(render_raw(values))
    pod = next(d for d in docs if d.get("kind") == "Deployment")["spec"]["template"]["spec"]
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    return next(c for c in containers if c["name"] == "oncegate"), pod.get("volumes", [])


def test_audit_spool_is_an_emptydir_and_anchors_go_to_their_own_claim():
    container, volumes = _sidecar(load_values("minimal"))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ONCEGATE_AUDIT_SPOOL_DIR"] == "/var/spool/oncegate"
    assert "ONCEGATE_AUDIT_ANCHOR_FILE" not in env
    spool = next(v for v in volumes if v["name"] == "oncegate-audit-spool")
    assert "emptyDir" in spool
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["oncegate-audit-spool"] == "/var/spool/oncegate"

    values = load_values("minimal")
    values["audit"] = {"spool": {"enabled": False}, "anchors": {"existingClaim": "worm-anchors"}}
    container, volumes = _sidecar(values)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "ONCEGATE_AUDIT_SPOOL_DIR" not in env
    names = [e["name"] for e in container["env"]]
    # $(ONCEGATE_INSTANCE_ID) expands only when that variable comes first.
    assert names.index("ONCEGATE_INSTANCE_ID") < names.index("ONCEGATE_AUDIT_ANCHOR_FILE")
    assert env["ONCEGATE_AUDIT_ANCHOR_FILE"] == "/var/lib/oncegate-anchors/$(ONCEGATE_INSTANCE_ID).jsonl"
    claim = next(v for v in volumes if v["name"] == "oncegate-audit-anchors")
    assert claim["persistentVolumeClaim"]["claimName"] == "worm-anchors"
    assert not any(v["name"] == "oncegate-audit-spool" for v in volumes)


def test_postgres_requires_a_synchronous_standby_by_default():
    _, sidecar = deployment_sidecar(render("production"))
    assert env_of(sidecar)["ONCEGATE_REQUIRE_SYNC_REPLICA"]["value"] == "true"
    values = load_values("production")
    values["database"]["requireSyncReplica"] = False
    _, sidecar = deployment_sidecar(parse_manifests(render_raw(values)))
    assert env_of(sidecar)["ONCEGATE_REQUIRE_SYNC_REPLICA"]["value"] == "false"
    _, embedded = deployment_sidecar(render("sqlite"))
    assert "ONCEGATE_REQUIRE_SYNC_REPLICA" not in env_of(embedded), "SQLite has no standby"


# --------------------------------------------------------------------------
# the console (docs/CONSOLE.md)

CONSOLE_ON = {
    "database": {"existingSecret": "pg"},
    "migration": {"database": {"existingSecret": "pg-owner"}, "consoleRole": "oncegate_console"},
    "console": {
        "enabled": True,
        "database": {"existingSecret": "pg-console"},
        "token": {"existingSecret": "console-token"},
        "relayMetrics": ["rel-oncegate-metrics:9464"],
    },
}


def test_console_is_off_by_default():
    for values_name in VALUES_FILES:
        docs = render(values_name)
        assert not [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "console"]


def test_console_is_a_deployment_and_service_of_its_own_and_validates():
    docs = parse_manifests(render_raw(CONSOLE_ON))
    consoles = [d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "console"]
    assert sorted(d["kind"] for d in consoles) == ["Deployment", "Service"]
    for doc in consoles:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    deployment = next(d for d in consoles if d["kind"] == "Deployment")
    spec = pod_spec(deployment)
    assert [c["name"] for c in spec["containers"]] == ["console"], "the console runs alone, not beside a consumer"
    console = spec["containers"][0]
    env = env_of(console)
    assert console["args"] == ["console"]
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "pg-console"
    assert env["ONCEGATE_CONSOLE_REQUIRE_READ_ONLY"]["value"] == "true"
    assert env["ONCEGATE_CONSOLE_TOKEN_FILE"]["value"] == "/etc/oncegate-console/token"
    assert env["ONCEGATE_CONSOLE_RELAY_METRICS"]["value"] == "rel-oncegate-metrics:9464"
    assert console["securityContext"]["readOnlyRootFilesystem"] is True
    # The consumers' Deployment does not select the console's pods, nor the reverse.
    consumer = one([d for d in docs if d not in consoles], "Deployment")
    console_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert not all(console_labels.get(k) == v for k, v in consumer["spec"]["selector"]["matchLabels"].items())
    job = one(docs, "Job")
    assert env_of(pod_spec(job)["containers"][0])["ONCEGATE_CONSOLE_ROLE"]["value"] == "oncegate_console"


@pytest.mark.parametrize(
    ("override", "complaint"),
    [
        ({"console": {"enabled": True, "token": {"existingSecret": "t"}}}, "console.enabled needs console.database.existingSecret"),
        ({"console": {"enabled": True, "database": {"existingSecret": "c"}}}, "console.enabled needs console.token.existingSecret"),
        (
            {"database": {"existingSecret": "pg"}, "migration": {"database": {"existingSecret": "pg-owner"}},
             "console": {"enabled": True, "database": {"existingSecret": "pg-owner"}, "token": {"existingSecret": "t"}}},
            "console.database must not be migration.database",
        ),
        (
            {"database": {"existingSecret": "pg"}, "migration": {"database": {"existingSecret": "pg-owner"}},
             "console": {"enabled": True, "database": {"existingSecret": "pg"}, "token": {"existingSecret": "t"}}},
            "console.database must not be database",
        ),
    ],
)
def test_console_guards_name_the_value(override, complaint):
    with pytest.raises(helm.HelmRenderError, match=re.escape(complaint)):
        render_raw(override)
