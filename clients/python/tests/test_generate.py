"""The stubs are generated from proto/ by grpcio-tools, not hand-written or committed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import generate
from conftest import PY_ROOT, REPO


def test_stubs_are_generated_from_proto_and_current():
    root = generate.proto_root()
    assert root == (REPO / "proto").resolve()
    assert not generate.is_stale(root, generate.DEFAULT_OUT)
    for path in generate.expected_outputs(generate.proto_files(root), generate.DEFAULT_OUT):
        assert path.exists(), path


def test_generated_service_matches_proto(tmp_path):
    written = generate.generate(generate.proto_root(), tmp_path)
    grpc_src = (tmp_path / "oncegate" / "v1" / "gate_pb2_grpc.py").read_text()
    for rpc in ("Submit", "SubmitBatch", "Lookup"):
        assert f"/oncegate.v1.Gate/{rpc}" in grpc_src
    assert "from oncegate.v1 import gate_pb2" in grpc_src
    effects_src = (tmp_path / "oncegate" / "v1" / "effects_pb2_grpc.py").read_text()
    for rpc in ("Begin", "Complete", "Release"):
        assert f"/oncegate.v1.Effects/{rpc}" in effects_src
    # __init__.py, then _pb2.py, _pb2.pyi and _pb2_grpc.py per proto file.
    assert len(written) == 1 + 3 * 2

    from oncegate import _stubs

    pb = _stubs.gate_pb2
    assert pb.DESCRIPTOR.package == "oncegate.v1"
    assert set(pb.DESCRIPTOR.services_by_name["Gate"].methods_by_name) == {
        "Submit", "SubmitBatch", "Lookup"}
    assert pb.Submission.DESCRIPTOR.fields_by_name["idempotency_key"].has_presence


def test_generated_files_are_gitignored():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    generated = PY_ROOT / "src" / "oncegate" / "v1" / "gate_pb2.py"
    result = subprocess.run(["git", "check-ignore", "-q", str(generated)], cwd=REPO)
    assert result.returncode == 0, f"{generated} must be gitignored"
