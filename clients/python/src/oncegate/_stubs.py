"""Import the generated stubs, with a useful message when they are missing."""

from __future__ import annotations

try:
    from .v1 import effects_pb2, effects_pb2_grpc, gate_pb2, gate_pb2_grpc
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "oncegate's gRPC stubs are not generated. They are built from proto/ by "
        "grpcio-tools: run `python clients/python/generate.py` (or reinstall the "
        "package with `pip install -e clients/python`)."
    ) from exc

__all__ = ["effects_pb2", "effects_pb2_grpc", "gate_pb2", "gate_pb2_grpc"]
