"""Fixtures that start real services live in tests/services/; they are plugins here."""

from kiteq.logging import configure_logging

pytest_plugins = ["tests.services.zookeeper", "tests.services.mariadb", "tests.services.spark"]

configure_logging("info")
