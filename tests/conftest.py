"""Fixtures that start real services live in tests/services/; they are plugins here."""

import hashlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiteq.logging import configure_logging

pytest_plugins = ["tests.services.zookeeper", "tests.services.mariadb", "tests.services.spark"]

configure_logging("info")

ROOT = Path(__file__).parents[1]


@pytest.fixture(autouse=True)
def logging_as_configured_here() -> Iterator[None]:
    """A test that runs a command's `main` (which configures logging, at `warning` say)
    leaves the tests after it logging as configured here: otherwise those that capture
    info logs saw nothing, depending on the order the tests ran in."""
    yield
    configure_logging("info")


def pytest_configure(config: pytest.Config) -> None:
    """Let the processes the tests start see Ctrl-C, and refuse stale compiled modules."""
    let_children_see_sigint()
    refuse_stale_builds()


def let_children_see_sigint() -> None:
    """A shell without job control starts a background job with SIGINT ignored (`make test &`
    in a script), and every program the job starts inherits that: the examples, which stop
    on Ctrl-C, would never see the SIGINT the tests send them. A handled signal is reset to
    its default when a child execs a program, so handling it here gives every child the default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def refuse_stale_builds() -> None:
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
