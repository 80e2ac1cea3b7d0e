"""docs/OPERATING.md (the command line): invalid configuration exits 64 with a message naming the setting."""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.sidecar


@pytest.mark.parametrize(
    "env_var,flag,value",
    [
        ("ONCEGATE_LISTEN", "--listen", "not-an-address"),
        ("ONCEGATE_METRICS_LISTEN", "--metrics-listen", "nowhere"),
        ("ONCEGATE_RELAY_SINK", "--relay-sink", "ftp://example.invalid"),
    ],
)
def test_invalid_configuration_exits_64_naming_the_setting(oncegate_bin, tmp_path, env_var, flag, value):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ONCEGATE_") and k not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"ONCEGATE_SQLITE_PATH": str(tmp_path / "oncegate.db"), env_var: value})
    result = subprocess.run([str(oncegate_bin), "serve"], env=env, cwd=tmp_path,
                            capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 64, output
    assert env_var in output or flag in output, output
