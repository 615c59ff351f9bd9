"""Compiles the modules of the per-message path with mypyc; everything else is in setup.cfg.

The broker's per-message work is spread over many small steps: the pure rules (framing,
the session's rules, the file store's index, schedule and records, delivery rounds) and
the glue a message passes through (framed streams, the broker's connections and handlers,
the dispatcher, lanes, groups and recover loop, the file store, the client's connection).
Compiled, the rules took 10-15 % off the broker's CPU per message, and the glue a further
10-30 % when draining a backlog or end to end (docs/performance-history.md). They stay plain
Python modules: with no C compiler or Python headers, or with KITEQ_PURE_PYTHON=1, the
package installs without compiling and runs the same code interpreted.

A compiled async function is a mypyc coroutine, which Trio runs like any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup

COMPILED = [
    # The rules: synchronous and free of Trio.
    "protocol/framing.py",
    "protocol/schedule.py",
    "protocol/session.py",
    "protocol/wire.py",
    "stores/entity.py",
    "stores/schedule.py",
    "stores/sortedids.py",
    "stores/waiting.py",
    "stores/file/index.py",
    "stores/file/messages.py",
    "stores/file/ops.py",
    "stores/file/records.py",
    "stores/file/cache.py",
    "stores/file/slow_writes.py",
    "kiteq/registry/bindings.py",
    "kiteq/server/delivery/rounds.py",
    "kiteq/server/events.py",
    "kiteq/server/latency.py",
    "kiteq/server/routing.py",
    "kiteq/server/validate.py",
    "kiteq/client/message.py",
    # The glue a message passes through. The client's Producer and Consumer stay interpreted:
    # mypyc's C for their decorated `__init__` (keyword options) does not build.
    "kiteq/server/delivery/dispatcher.py",
    "kiteq/server/delivery/lanes.py",
    "kiteq/server/delivery/recover.py",
    "kiteq/server/groups.py",
    "kiteq/server/handlers.py",
    "kiteq/server/connection.py",
    "kiteq/transport.py",
    "stores/idle.py",
    "stores/memory.py",
    "stores/file/store.py",
    "stores/file/writer.py",
    "stores/file/segment.py",
    "stores/file/summary.py",
    "stores/file/layout.py",
    "kiteq/client/connection.py",
]

# What each compiled module's source was when it was compiled: tests/conftest.py refuses to
# run a compiled module whose source has changed since (an in-place build shadows the .py).
SOURCES_MANIFEST = Path("build/compiled-sources.json")

# The same build wherever it runs: the compiled modules' own annotations, and every other
# library seen as untyped (an installing venv may hold none of them yet, or any version).
# `make lint` type-checks the project strictly with its dependencies installed.
MYPY_OPTIONS = ["--config-file=", "--no-site-packages", "--ignore-missing-imports", "--follow-imports=silent"]

# mypyc's support code, shared by the compiled modules, lives inside a package: an editable
# install maps packages, not the repository's root.
SHARED_LIBRARY = "protocol.compiled"


# Commands that only describe the package: mypyc's analysis (most of a build's time) is skipped.
METADATA_COMMANDS = {"egg_info", "dist_info", "sdist"}


def _why_not_compiled() -> str | None:
    if os.environ.get("KITEQ_PURE_PYTHON") == "1":
        return "KITEQ_PURE_PYTHON=1"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h)"
    return None


def _extensions() -> list[Extension]:
    if METADATA_COMMANDS.intersection(sys.argv[1:2]):
        return []
    reason = _why_not_compiled()
    if reason is not None:
        print(f"kiteq-py: installing without compiled modules: {reason}", file=sys.stderr)
        _remove_in_place_builds()
        return []
    from mypyc.build import mypycify

    SOURCES_MANIFEST.parent.mkdir(exist_ok=True)
    digests = {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in COMPILED}
    SOURCES_MANIFEST.write_text(json.dumps(digests, indent=1))
    return mypycify([*MYPY_OPTIONS, *COMPILED], group_name=SHARED_LIBRARY)


def _remove_in_place_builds() -> None:
    """An interpreted install must not leave an earlier build's modules shadowing the sources."""
    for path in [*COMPILED, SHARED_LIBRARY.replace(".", "/") + "__mypyc.py"]:
        for built in Path(path).parent.glob(Path(path).stem + ".cpython-*.so"):
            built.unlink()


setup(ext_modules=_extensions())
