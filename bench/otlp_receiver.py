"""A local OTLP/gRPC trace receiver for scripts/trace-cost: accepts
`opentelemetry.proto.collector.trace.v1.TraceService/Export` and answers an
empty ExportTraceServiceResponse, counting requests and bytes (printed on
SIGTERM). Needs only grpcio: messages are taken as raw bytes.

    python bench/otlp_receiver.py 127.0.0.1:4317
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures

import grpc

received = {"requests": 0, "bytes": 0}
lock = threading.Lock()


def export(request: bytes, context) -> bytes:
    with lock:
        received["requests"] += 1
        received["bytes"] += len(request)
    return b""  # an empty ExportTraceServiceResponse


def main() -> int:
    address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:4317"
    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(address)
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    server.stop(1)
    print(f"otlp receiver: {received['requests']} export requests, {received['bytes']} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
