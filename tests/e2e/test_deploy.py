"""deploy/: what can be checked without Docker or systemd.

The image is not built here. These tests check that every file the Dockerfile copies is in
the repository and in its build context, that the compose file has the structure Compose
reads, and that every `kiteq-server` flag the Dockerfile, compose file and systemd unit pass
is one the installed console script accepts, with values its config accepts.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kiteq.cli.server import config_from_argv
from tests.procs.runner import ROOT

DEPLOY = ROOT / "deploy"
CONFIG_IN_IMAGE = "/etc/kiteq/kiteq.toml"


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", dockerfile)
    return [
        (word.upper(), rest.strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
        for word, _, rest in [line.strip().partition(" ")]
    ]


def parse_yaml_subset(text: str) -> dict[str, Any]:
    """The YAML compose.yaml is written in: nested maps, `- item` lists, scalars and JSON-style
    flow lists. Enough to read its structure without PyYAML (not a dependency); anything
    else raises, so the file stays this simple."""
    lines = [
        (len(line) - len(line.lstrip()), line.strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]

    def scalar(value: str) -> Any:
        return json.loads(value) if value[:1] in '["' else value

    def block(start: int, indent: int) -> tuple[Any, int]:
        if lines[start][1].startswith("- "):
            items = []
            while start < len(lines) and lines[start][0] == indent and lines[start][1].startswith("- "):
                items.append(scalar(lines[start][1][2:]))
                start += 1
            return items, start
        mapping: dict[str, Any] = {}
        while start < len(lines) and lines[start][0] == indent:
            key, colon, value = lines[start][1].partition(":")
            assert colon and " " not in key, f"not a `key: value` line: {lines[start][1]!r}"
            start += 1
            if value.strip():
                mapping[key] = scalar(value.strip())
            elif start < len(lines) and lines[start][0] > indent:
                mapping[key], start = block(start, lines[start][0])
            else:
                mapping[key] = None
        return mapping, start

    parsed, end = block(0, 0)
    assert end == len(lines), f"unexpected indentation at {lines[end][1]!r}"
    assert isinstance(parsed, dict)
    return parsed


@pytest.fixture(scope="module")
def server_flags() -> set[str]:
    """The flags `kiteq-server --help` lists, from the console script as installed."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("kiteq-server")), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", result.stdout))


def check_server_arguments(arguments: list[str], flags: set[str]) -> None:
    """Every flag exists, and the arguments (the image's config file read from deploy/) load."""
    used = {argument for argument in arguments if argument.startswith("--")}
    assert used and used <= flags, f"kiteq-server does not accept {sorted(used - flags)}"
    local = [
        str(DEPLOY / "kiteq.toml") if argument == CONFIG_IN_IMAGE else argument for argument in arguments
    ]
    config_from_argv(local)


def test_every_file_the_dockerfile_copies_is_in_the_build_context() -> None:
    steps = instructions((DEPLOY / "Dockerfile").read_text())
    allowed = {
        line[1:]
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copies = [args.split() for name, args in steps if name == "COPY" and not args.startswith("--from")]
    sources = [source for *sources, _ in copies for source in sources]
    assert "deploy/kiteq.toml" in sources and "setup.cfg" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
        assert source in allowed, f"{source} is left out of the build context by Dockerfile.dockerignore"
    # setup.cfg's packages, its long description and setup.py (the compiled modules): what `pip wheel .` reads.
    assert {"protocol", "stores", "kiteq", "spark_jobs", "README.md", "pyproject.toml", "setup.py"} <= set(
        sources
    )


def test_the_image_runs_a_non_root_broker_with_a_volume_ports_and_a_healthcheck(
    server_flags: set[str],
) -> None:
    steps = dict(instructions((DEPLOY / "Dockerfile").read_text())[::-1])  # the last of each
    froms = [args for name, args in instructions((DEPLOY / "Dockerfile").read_text()) if name == "FROM"]
    assert all(args.startswith("python:3.11-slim") for args in froms)
    assert steps["USER"] == "kiteq"
    assert steps["VOLUME"] == "/var/lib/kiteq"
    assert set(steps["EXPOSE"].split()) == {"13800", "13801"}
    assert "http://127.0.0.1:13801/healthz" in steps["HEALTHCHECK"]
    assert json.loads(steps["ENTRYPOINT"]) == ["kiteq-server"]
    command = json.loads(steps["CMD"])
    check_server_arguments(command, server_flags)
    assert "--admin-bind" in command and "0.0.0.0:13801" in command, "the healthcheck and EXPOSE need it"


def test_compose_runs_the_broker_against_its_zookeeper(server_flags: set[str]) -> None:
    compose = parse_yaml_subset((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"zookeeper", "kiteq"}
    broker = services["kiteq"]
    assert broker["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert broker["depends_on"] == ["zookeeper"]
    command = broker["command"]
    check_server_arguments(command, server_flags)
    assert command[command.index("--registry") + 1].startswith("zk://zookeeper:2181")
    assert command[command.index("--bind") + 1] == f"{broker['hostname']}:13800"
    assert set(compose["volumes"]) >= {"kiteq-data"}
    assert "kiteq-data:/var/lib/kiteq" in broker["volumes"]
    assert broker["logging"]["options"]["max-file"] == "5", "Docker keeps the broker's stderr bounded"


def test_systemd_unit_starts_the_console_script_with_options_it_accepts(server_flags: set[str]) -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((DEPLOY / "kiteq-server.service").read_text())
    service = unit["Service"]
    program, *arguments = shlex.split(service["ExecStart"])
    assert Path(program).name == "kiteq-server"
    assert "kiteq-server = kiteq.cli.server:main" in (ROOT / "setup.cfg").read_text()
    check_server_arguments(arguments, server_flags)
    assert arguments[:2] == ["--config", CONFIG_IN_IMAGE]
    assert service["User"] == "kiteq" and service["Restart"] == "on-failure"
    assert int(service["LimitNOFILE"]) > 10_000, "more than max_connections' default"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
