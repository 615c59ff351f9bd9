"""Fixtures that start real services live in tests/services/; they are plugins here."""

pytest_plugins = ["tests.services.zookeeper", "tests.services.mariadb", "tests.services.spark"]

from kiteq.logging import configure_logging

configure_logging("info")
