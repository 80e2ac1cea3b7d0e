"""The console in a real browser (Debian's chromium, headless, driven by
Playwright for Python), as a person uses it (docs/CONSOLE.md).

Starts what it needs: a database and a read-only console role on the test
Postgres (ONCEGATE_TEST_DATABASE_URL, a superuser), a Kafka broker of its own
that creates no topic on first use (scripts/kafka --no-auto-create), a
sidecar relaying to a topic that does not exist yet, and the console. Then:
refused without the token; an award found from the search box; a delivery's
history; a duplicate's decisions, found by the key prefix the logs print; the
relay paused on the missing topic with the event waiting in its slot, then
published once the topic exists; the trail verifying, then failing after the
owner rewrites an audit row.

ONCEGATE_CONSOLE_SCREENSHOTS=DIR saves the main pages there (docs/console).
"""

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

from confluent_kafka.admin import AdminClient, NewTopic
from playwright.sync_api import expect, sync_playwright

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("ONCEGATE_BIN", os.path.join(ROOT, "target", "debug", "oncegate"))
ADMIN_URL = os.environ["ONCEGATE_TEST_DATABASE_URL"]
SHOTS = os.environ.get("ONCEGATE_CONSOLE_SCREENSHOTS")
AWARD = "AWD-2026-0142"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, proc=None, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {port} within {timeout}s")


def url_with_db(url, db, user=None):
    u = urllib.parse.urlsplit(url)
    netloc = u.netloc if user is None else f"{user}@{u.hostname}:{u.port}"
    return urllib.parse.urlunsplit((u.scheme, netloc, "/" + db, u.query, ""))


def psql(url, sql):
    return subprocess.run(["psql", url, "-Atqc", sql], check=True, capture_output=True, text=True).stdout.strip()


class Stack:
    """The database, Kafka, the sidecar and the console; stopped by close()."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="og-console-")
        self.procs = []
        tag = secrets.token_hex(4)
        self.db, self.role = f"og_console_{tag}", f"og_console_ro_{tag}"
        psql(ADMIN_URL, f'CREATE DATABASE "{self.db}"')
        psql(ADMIN_URL, f'CREATE ROLE "{self.role}" LOGIN')
        self.owner_url = url_with_db(ADMIN_URL, self.db)
        subprocess.run([BIN, "migrate", "--database-url", self.owner_url, "--console-role", self.role],
                       check=True, capture_output=True)
        self.kafka_port = free_port()
        self.kafka_dir = os.path.join(self.tmp, "kafka")
        subprocess.run([os.path.join(ROOT, "scripts", "kafka"), "start", self.kafka_dir, str(self.kafka_port),
                        "--no-auto-create"], check=True)
        self.topic = f"console-events-{tag}"
        self.grpc, self.metrics, self.web = free_port(), free_port(), free_port()
        self.token = secrets.token_urlsafe(24)
        with open(os.path.join(self.tmp, "token"), "w") as f:
            f.write(self.token + "\n")

    def spawn(self, args, log):
        out = open(os.path.join(self.tmp, log), "w")
        p = subprocess.Popen([BIN, *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def start(self):
        sidecar = self.spawn(["serve", "--database-url", self.owner_url, "--migrate-on-start", "false",
                              "--listen", f"127.0.0.1:{self.grpc}", "--metrics-listen", f"127.0.0.1:{self.metrics}",
                              "--relay-sink", f"kafka://127.0.0.1:{self.kafka_port}", "--relay-stream", self.topic,
                              "--audit-seal-interval", "1s", "--instance-id", "pod-a"], "sidecar.log")
        wait_port(self.grpc, "the sidecar", sidecar)
        console = self.spawn(["console", "--database-url", url_with_db(ADMIN_URL, self.db, self.role),
                              "--console-listen", f"127.0.0.1:{self.web}",
                              "--console-token-file", os.path.join(self.tmp, "token"),
                              "--console-relay-metrics", f"127.0.0.1:{self.metrics}"], "console.log")
        wait_port(self.web, "the console", console)

    def submit(self, ts, payload, cents=12500):
        out = subprocess.run([BIN, "submit", "--target", f"127.0.0.1:{self.grpc}", "--award-id", AWARD,
                              "--amount-cents", str(cents), "--timestamp", ts, "--payload", payload],
                             check=True, capture_output=True, text=True).stdout
        return re.search(r"idempotency_key (\S+)", out).group(1), out.split()[0]

    def create_topic(self):
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{self.kafka_port}"})
        for f in admin.create_topics([NewTopic(self.topic, 1, 1)]).values():
            f.result(30)

    def close(self, ok):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run([os.path.join(ROOT, "scripts", "kafka"), "stop", self.kafka_dir], capture_output=True)
        if not ok:
            for log in ("sidecar.log", "console.log"):
                path = os.path.join(self.tmp, log)
                if os.path.exists(path):
                    print(f"--- {log} (last 40 lines)", file=sys.stderr)
                    print("".join(open(path).readlines()[-40:]), file=sys.stderr)
        psql(ADMIN_URL, f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
        psql(ADMIN_URL, f'DROP ROLE IF EXISTS "{self.role}"')
        shutil.rmtree(self.tmp, ignore_errors=True)


def shot(page, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def until(page, url, locator_text, timeout=60):
    """Reloads `url` until the page shows `locator_text` (the state is
    waited for, never assumed)."""
    deadline = time.time() + timeout
    while True:
        page.goto(url)
        if locator_text in page.content():
            return
        if time.time() > deadline:
            raise AssertionError(f"{url} never showed {locator_text!r}; last page:\n{page.inner_text('main')}")
        time.sleep(0.5)


def check_refused_without_token(page, base):
    response = page.goto(base + "/")
    assert response.status == 401, response.status
    assert response.headers["www-authenticate"].startswith("Bearer")
    expect(page.locator("main")).to_contain_text("bearer token")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    for path in ("/relay", "/trail", f"/award?id={AWARD}", "/trail/export"):
        assert page.goto(base + path).status == 401, path
    page.fill("input[name=token]", "not-the-token")
    page.click("form.login button")
    expect(page.locator("main")).to_contain_text("not this console's")
    shot(page, "unauthorized")


def check_award(page, base, keys):
    page.fill("header input[name=q]", AWARD)
    page.press("header input[name=q]", "Enter")
    page.wait_for_url("**/award?id=*")
    expect(page.locator("#balance")).to_contain_text("375.00")
    expect(page.locator("#reconcile")).to_contain_text("Agrees")
    rows = page.locator("#disbursements tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text(keys[0][:12])
    shot(page, "award")


def check_delivery_and_duplicate(page, base, first_key):
    # The prefix the logs print (key=552f06f5accf) finds the delivery.
    page.goto(base + "/")
    page.fill("main input[name=q]", first_key[:12])
    page.press("main input[name=q]", "Enter")
    page.wait_for_url("**/delivery?key=*")
    expect(page.locator("main")).to_contain_text(first_key)
    expect(page.locator("main")).to_contain_text("125.00")
    decisions = page.locator("#decisions tbody tr")
    expect(decisions).to_have_count(2)
    expect(decisions.nth(0)).to_contain_text("processed")
    duplicate = page.locator("#decisions tr.decision-duplicate")
    expect(duplicate).to_contain_text("LOCAL_CACHE")
    expect(duplicate).to_contain_text("pod-a")
    expect(duplicate.locator("td").nth(4)).to_have_text("no")


def check_relay_waits_then_publishes(page, base, stack, first_key):
    until(page, base + "/relay", "does not exist")
    expect(page.locator("#breakers")).to_contain_text(stack.topic)
    expect(page.locator("#backlog")).not_to_contain_text("Waiting events 0")
    page.goto(base + "/delivery?key=" + urllib.parse.quote(first_key, safe=""))
    expect(page.locator("td.state-pending")).to_contain_text("waiting")
    shot(page, "delivery")
    page.goto(base + "/relay")
    shot(page, "relay")
    stack.create_topic()
    until(page, base + "/relay", "publishing to kafka")
    until(page, base + "/delivery?key=" + urllib.parse.quote(first_key, safe=""), "state-published")
    until(page, base + "/relay", "<td>0</td>")


def check_trail(page, base, stack):
    until(page, base + "/trail", 'id="seals"')
    page.click("#verify")
    until(page, base + "/trail", "VERIFIED")
    with page.expect_download() as download:
        page.click("form.export button")
    lines = open(download.value.path()).read().splitlines()
    assert lines and all(line.startswith("{") for line in lines), lines[:3]
    shot(page, "trail")
    # The owner rewrites an audit row behind the triggers' back.
    psql(stack.owner_url, "SET session_replication_role = replica; "
                          "UPDATE audit_log SET instance = 'someone-else' WHERE id = (SELECT min(id) FROM audit_log)")
    page.goto(base + "/trail")
    page.click("#verify")
    until(page, base + "/trail", "FAILED")
    expect(page.locator("#report")).to_contain_text("changed")
    shot(page, "trail-failed")


def main():
    stack = Stack()
    ok = False
    try:
        stack.start()
        keys = [stack.submit(f"2026-03-0{i}T10:00:00Z", f"march {i}")[0] for i in (1, 2, 3)]
        again, decision = stack.submit("2026-03-01T10:00:00Z", "march 1")
        assert again == keys[0] and decision == "DUPLICATE", (again, decision)
        base = f"http://127.0.0.1:{stack.web}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                                        args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900}, accept_downloads=True)
            check_refused_without_token(page, base)
            page.fill("input[name=token]", stack.token)
            page.click("form.login button")
            page.wait_for_url(base + "/")
            shot(page, "find")
            check_award(page, base, keys)
            check_delivery_and_duplicate(page, base, keys[0])
            check_relay_waits_then_publishes(page, base, stack, keys[0])
            check_trail(page, base, stack)
            browser.close()
        ok = True
        print("console browser tests: all passed")
    finally:
        stack.close(ok)


if __name__ == "__main__":
    main()
