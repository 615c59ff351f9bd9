"""One real local SparkSession for the whole test session.

Starting the JVM costs ~6 s and its first job as much again, so every Spark test shares
this session: `local[2]` for the 2-core machines, few shuffle partitions for test-sized
data, a quick-starting JVM, and everything bound to loopback with the web UI off.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.services.ports import require_service

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    # A short-lived test JVM: skip the optimising JIT tier, use the simplest collector.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def spark_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    has_java = shutil.which("java") is not None or (
        java_home is not None and (Path(java_home) / "bin/java").exists()
    )
    return has_java and importlib.util.find_spec("pyspark") is not None


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local[2] SparkSession shared by all tests; stopped at the end of the session."""
    require_service(spark_available(), "Spark (Java 17 and pyspark)")
    from spark_jobs.session import spark_session

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    conf = SPARK_CONF | {"spark.local.dir": str(tmp_path_factory.mktemp("spark-local"))}
    with spark_session("local[2]", "kiteq-tests", conf) as session:
        yield session
