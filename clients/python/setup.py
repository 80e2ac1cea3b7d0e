"""Build hook: generate the gRPC stubs from ../../proto before packaging.

All metadata lives in pyproject.toml. The stubs (package oncegate.v1) must
exist before setuptools even validates the package list, so they are generated
here, at import time, by grpcio-tools (a build requirement) — for `pip install .`,
`pip install -e .` and `pip wheel .` alike.
"""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402

generate.ensure_stubs()

# The runtime versions the generated code demands (see generate.py).
setup(install_requires=generate.runtime_requirements())
