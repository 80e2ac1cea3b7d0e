#!/usr/bin/env python3
"""A gRPC health probe as the kubelet runs one (`grpc:` probes): one
`grpc.health.v1.Health/Check` with the probe's service name; the probe
passes only on SERVING.

    probe.py 127.0.0.1:50052 [--service oncegate.v1.Gate] [--wait 60]

With --wait it probes every --period seconds until one passes, prints the
seconds it took, and exits 1 (saying what it last saw) if none did in time.
"""

from __future__ import annotations

import argparse
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, service: str = "", timeout: float = 2.0) -> str:
    """The status name (SERVING, NOT_SERVING, …) or the RPC's error code name."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_serving(target: str, service: str = "", wait: float = 60.0, period: float = 0.05) -> float:
    """Seconds until a probe passed; raises TimeoutError naming the last answer."""
    start = time.monotonic()
    last = "no probe yet"
    while True:
        last = check(target, service)
        if last == "SERVING":
            return time.monotonic() - start
        if time.monotonic() - start > wait:
            raise TimeoutError(f"{target} service {service!r}: {last} after {wait:.0f} s")
        time.sleep(period)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="host:port of the health listener")
    p.add_argument("--service", default="", help="health service name ('' = the server)")
    p.add_argument("--wait", type=float, default=0, help="keep probing this many seconds")
    p.add_argument("--period", type=float, default=0.05, help="seconds between probes")
    args = p.parse_args()
    if not args.wait:
        status = check(args.target, args.service)
        print(status)
        return 0 if status == "SERVING" else 1
    try:
        print(f"{wait_serving(args.target, args.service, args.wait, args.period):.3f}")
    except TimeoutError as exc:
        print(f"probe failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
