"""Fixtures: the real oncegate sidecar, a Gate client (sync and asyncio), Redis, unique names.

The sidecar binary comes from ONCEGATE_BIN (default <repo>/target/debug/oncegate,
built by `cargo build`). Tests that need it are skipped only when that file
does not exist; when it exists they run for real and fail on any misbehaviour.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PY_ROOT = HERE.parent
REPO = PY_ROOT.parent.parent

# Make `import oncegate` and `import generate` work even without an install,
# and make sure the stubs exist and match proto/ (generated at test time).
sys.path.insert(0, str(PY_ROOT / "src"))
sys.path.insert(0, str(PY_ROOT))
import generate  # noqa: E402

generate.ensure_stubs()

DEFAULT_BIN = REPO / "target" / "debug" / "oncegate"
STARTUP_TIMEOUT = float(os.environ.get("ONCEGATE_TEST_STARTUP_TIMEOUT", "60"))


def oncegate_bin_path() -> Path:
    return Path(os.environ.get("ONCEGATE_BIN", DEFAULT_BIN))


@pytest.fixture(scope="session")
def oncegate_bin() -> Path:
    path = oncegate_bin_path()
    if not path.exists():
        pytest.skip(
            f"oncegate binary not found at {path}: run `cargo build` or set ONCEGATE_BIN"
        )
    return path


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768-60999
    on Linux): a port from bind(0) is one any outgoing connection (to Kafka,
    Redis, the sidecar) may take between our release and the sidecar's bind,
    or while a sidecar stopped mid-test is away from it."""
    rng = random.SystemRandom()
    while True:
        port = rng.randrange(20_000, 32_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def seed_from_env() -> int:
    """The seed of a test's random data: ONCEGATE_TEST_SEED when set (to
    replay a failure), else a fresh one."""
    value = os.environ.get("ONCEGATE_TEST_SEED", "").strip()
    if value:
        return int(value)
    return random.SystemRandom().randrange(1, 2**32)


@pytest.fixture
def seed(request) -> int:
    """A random test's seed, printed at once and named again in its failure
    report: ONCEGATE_TEST_SEED=<it> replays the data."""
    value = seed_from_env()
    request.node.oncegate_seed = value
    print(f"ONCEGATE_TEST_SEED={value}")
    return value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    value = getattr(item, "oncegate_seed", None)
    if value is not None and report.failed:
        report.sections.append(("seed", f"replay with: ONCEGATE_TEST_SEED={value} pytest '{item.nodeid}'"))


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child Python processes: finds the package from src/."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PY_ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.update(extra)
    return env


@dataclass
class Sidecar:
    process: subprocess.Popen
    target: str
    metrics_addr: str
    sqlite_path: Path
    log_path: Path

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 25.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode


def health_status(target: str, service: str = "", timeout: float = 1.0) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def start_sidecar(binary: Path, workdir: Path, extra_env: dict[str, str] | None = None,
                  port: int | None = None, metrics_port: int | None = None) -> Sidecar:
    """Start `oncegate serve` on free loopback ports (or the given ones, to
    restart one in place) with embedded SQLite and wait for grpc.health.v1
    SERVING."""
    import grpc

    workdir.mkdir(parents=True, exist_ok=True)
    port, metrics_port = port or free_port(), metrics_port or free_port()
    target = f"127.0.0.1:{port}"
    metrics_addr = f"127.0.0.1:{metrics_port}"
    sqlite_path = workdir / "oncegate.db"
    log_path = workdir / "oncegate.log"
    env = {
        k: v
        for k, v in os.environ.items()
        # A test sidecar gets exactly the configuration given here.
        if not k.startswith("ONCEGATE_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        ONCEGATE_LISTEN=target,
        ONCEGATE_METRICS_LISTEN=metrics_addr,
        ONCEGATE_SQLITE_PATH=str(sqlite_path),
        ONCEGATE_INSTANCE_ID=f"pytest-{os.getpid()}",
        RUST_LOG=os.environ.get("RUST_LOG", "info"),
    )
    env.update(extra_env or {})
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [str(binary), "serve"],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    sidecar = Sidecar(process, target, metrics_addr, sqlite_path, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    last = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"oncegate serve exited with code {process.returncode} before SERVING; "
                f"log:\n{sidecar.log_tail()}"
            )
        try:
            last = health_status(target)
            if last == "SERVING":
                return sidecar
        except grpc.RpcError as exc:
            last = f"{exc.code().name}: {exc.details()}"
        time.sleep(0.1)
    sidecar.stop()
    pytest.fail(
        f"oncegate serve not SERVING within {STARTUP_TIMEOUT}s (last health answer: {last}); "
        f"log:\n{sidecar.log_tail()}"
    )


@pytest.fixture(scope="session")
def sidecar(oncegate_bin, tmp_path_factory) -> Sidecar:
    extra = {}
    if os.environ.get("ONCEGATE_TEST_L2") == "1":
        extra["REDIS_URL"] = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    sc = start_sidecar(oncegate_bin, tmp_path_factory.mktemp("sidecar"), extra)
    yield sc
    code = sc.stop()
    if code not in (0, None):
        print(f"oncegate serve exited with {code}; log tail:\n{sc.log_tail()}", file=sys.stderr)


CLIENT_KINDS = ("sync", "aio")


@pytest.fixture(scope="session")
def aio_loop():
    """One asyncio event loop in a thread, driving every asyncio client."""
    from helpers import EventLoopThread

    lt = EventLoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="session", params=CLIENT_KINDS)
def client_kind(request) -> str:
    """Every test that uses `gate` or `make_gate` runs once per client: the
    synchronous `oncegate.Gate` and the asyncio `oncegate.aio.Gate`."""
    return request.param


@pytest.fixture(scope="session")
def make_gate(client_kind, aio_loop):
    """A factory for the client under test, with the sync client's interface:
    the asyncio one is driven through `helpers.BlockingAioGate`, so each test
    body checks both clients."""
    from helpers import BlockingAioGate
    from oncegate import Gate

    def make(*args, **kwargs):
        if client_kind == "aio":
            return BlockingAioGate(aio_loop, *args, **kwargs)
        return Gate(*args, **kwargs)

    return make


@pytest.fixture(scope="session")
def gate(sidecar, make_gate):
    with make_gate(sidecar.target, timeout=30.0) as g:
        yield g


@pytest.fixture(scope="session")
def sync_gate(sidecar):
    """The synchronous client, for tests about something else (the examples)."""
    from oncegate import Gate

    with Gate(sidecar.target, timeout=30.0) as g:
        yield g


@pytest.fixture
def unique() -> str:
    """A short unique prefix for award ids, stream names and keys in one test."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")


@pytest.fixture
def redis_client(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis not reachable at {redis_url} (set REDIS_URL): {exc}")
    yield client
    client.close()


@pytest.fixture
def stream_name(redis_client, unique):
    name = f"oncegate-test:{unique}"
    yield name
    redis_client.delete(name, f"{name}:dead")
