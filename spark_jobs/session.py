"""Building and stopping a SparkSession, shared by the job, its tests and its benchmark."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import SparkSession


@contextmanager
def spark_session(master: str, app_name: str, conf: Mapping[str, str]) -> Iterator[SparkSession]:
    """A new session with `conf`, quiet logging, and stopped when the block ends."""
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
