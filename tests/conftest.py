"""Fixtures that start real services live in tests/services/; they are plugins here."""

import hashlib
import json
from pathlib import Path

import pytest

from kiteq.logging import configure_logging

pytest_plugins = ["tests.services.zookeeper", "tests.services.mariadb", "tests.services.spark"]

configure_logging("info")

ROOT = Path(__file__).parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test a compiled module whose source changed after it was built: Python
    imports the in-place build, not the edited .py (setup.py explains the compiled modules)."""
    manifest = ROOT / "build" / "compiled-sources.json"
    if not manifest.exists():
        return
    changed = [
        path
        for path, digest in json.loads(manifest.read_text()).items()
        if any((ROOT / path).parent.glob(Path(path).stem + ".cpython-*.so"))
        and hashlib.sha256((ROOT / path).read_bytes()).hexdigest() != digest
    ]
    if changed:
        raise pytest.UsageError(
            f"{', '.join(changed)} changed since it was compiled, and Python would run the old build: "
            "`make test` rebuilds it (or `KITEQ_PURE_PYTHON=1 .venv/bin/pip install -e .` runs it interpreted)"
        )
