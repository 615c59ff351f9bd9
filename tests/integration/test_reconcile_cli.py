"""`kiteq-reconcile` refuses a path that does not exist before it starts Spark.

No SparkSession here: the console script runs with no Java it could find, so a check made
after Spark started would fail differently (and seconds later) than the one asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.reconcile import _local_path_exists

SCRIPT = Path(sys.executable).parent / "kiteq-reconcile"


def run_without_java(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAVA_HOME": "/nonexistent", "PATH": "/nonexistent"}
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL
    )


def test_a_missing_path_is_a_usage_error_before_spark(tmp_path: Path) -> None:
    present = tmp_path / "broker.log"
    present.write_text("{}\n")
    done = run_without_java(str(present), str(tmp_path / "brokr.log"), f"file://{tmp_path}/nothing-*.log")
    assert done.returncode == 2
    assert done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last == f"kiteq-reconcile: error: no such path: {tmp_path}/brokr.log, file://{tmp_path}/nothing-*.log"
    )
    assert "reconcile.reading" not in done.stderr  # logged once a session exists


@pytest.mark.parametrize(
    ("path", "exists"),
    [
        ("{here}/a.log", True),
        ("{here}/*.log", True),
        ("file://{here}/a.log", True),
        ("file:{here}", True),
        ("{here}/b.log", False),
        ("{here}/*.gz", False),
        ("file://{here}/b.log", False),
        # Hadoop's brace globs and remote file systems are Spark's to resolve.
        ("{here}/{{a,b}}.log", True),
        ("hdfs://namenode/logs/*.log", True),
        ("s3a://bucket/logs/", True),
    ],
)
def test_which_paths_are_checked_locally(tmp_path: Path, path: str, exists: bool) -> None:
    (tmp_path / "a.log").write_text("{}\n")
    assert _local_path_exists(path.format(here=tmp_path)) is exists
