# The README's two commands: `make run` and `make test`. Both set themselves up on a fresh
# Debian machine with Python 3.11: `make run` installs only what the broker needs, `make test`
# adds the test, Spark and dev extras (pyspark alone is most of that venv).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
# setup.py compiles these modules with mypyc in place: an edit to one reinstalls the package
# (KITEQ_PURE_PYTHON=1 installs without compiling).
COMPILED := $(shell grep -oE '"(protocol|stores|kiteq)/[a-z_/]+\.py"' setup.py | tr -d '"')

.PHONY: run test bench bench-services proto lint docs services clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(RUN_STAMP): setup.cfg setup.py pyproject.toml $(COMPILED) | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml $(COMPILED) | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test,spark,dev]'
	touch $(STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/kiteq-server $(ARGS)

# ZooKeeper, MariaDB and Chromium (the dashboard test) come from Debian's packages;
# tests start their own instances.
services:
	@if ! test -f /usr/share/java/zookeeper.jar || ! command -v mariadbd >/dev/null \
			|| ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			zookeeper mariadb-server chromium chromium-driver; \
	fi

test: $(STAMP) services lint
	$(PY) -m pytest $(ARGS)

# The versus_rabbitmq suite needs pika (setup.cfg's `bench` extra) and Debian's RabbitMQ;
# it starts its own throwaway node.
bench: $(STAMP) bench-services
	$(PY) -c 'import pika' 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(PY) -m benchmarks $(ARGS)

bench-services:
	@if ! command -v rabbitmq-server >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server; \
	fi

# mypy checks the `files` that setup.cfg's [mypy] names.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# docs/configuration.md is generated from kiteq/config.py; a test fails when it is stale.
docs: $(RUN_STAMP)
	$(PY) -m kiteq.config_docs docs/configuration.md

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I protocol --python_out=protocol --pyi_out=protocol protocol/kiteq.proto

clean:
	rm -rf $(VENV) data build .pytest_cache .mypy_cache
	find protocol stores kiteq -name '*.so' -delete
