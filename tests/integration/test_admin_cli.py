"""`kiteq-admin` registry commands, run as a user runs them, against zk:// and file://."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from kiteq.registry import open_registry
from tests.services.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def admin(registry: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kiteq.cli.admin", "--registry", registry, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(
    params=[pytest.param("file"), pytest.param("zk", marks=pytest.mark.zookeeper)],
)
def registry_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return request.getfixturevalue("zk_uri")
    return f"file://{tmp_path}/registry.json"


def test_bindings_add_list_remove(registry_uri: str) -> None:
    added = admin(
        registry_uri, "bindings", "add", "--group", "sms", "--topic", "trade", "--direct", "pay-succ"
    )
    assert added.returncode == 0, added.stderr
    assert "bound group sms to topic trade: direct pay-succ" in added.stdout
    added = admin(registry_uri, "--json", "bindings", "add", "--group", "sms", "--topic", "trade",
                  "--regex", "refund-.*", "--watermark", "50", "--no-persistent")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["persistent"] is False
    assert (
        admin(registry_uri, "bindings", "add", "--group", "mail", "--topic", "trade", "--fanout").returncode
        == 0
    )

    conflict = admin(registry_uri, "bindings", "add", "--group", "sms", "--topic", "trade", "--fanout")
    assert conflict.returncode == 2
    assert conflict.stderr.startswith("error: ") and "overlaps" in conflict.stderr

    table = admin(registry_uri, "bindings", "list", "--topic", "trade").stdout.splitlines()
    assert table[0].split() == ["GROUP", "TOPIC", "BIND", "MESSAGE_TYPE", "WATERMARK", "PERSISTENT"]
    assert [line.split() for line in table[1:]] == [
        ["mail", "trade", "fanout", "*", "1000", "yes"],
        ["sms", "trade", "direct", "pay-succ", "1000", "yes"],
        ["sms", "trade", "regex", "refund-.*", "50", "no"],
    ]
    column = table[0].index("TOPIC")  # aligned: every row's topic starts under the header
    assert all(line[column:].startswith("trade ") for line in table[1:])
    listed = json.loads(admin(registry_uri, "--json", "bindings", "list", "--group", "sms").stdout)
    assert listed == [
        {"groupId": "sms", "topic": "trade", "messageType": "pay-succ", "bindType": 0, "version": "1.0.0",
         "watermark": 1000, "persistent": True},
        {"groupId": "sms", "topic": "trade", "messageType": "refund-.*", "bindType": 1, "version": "1.0.0",
         "watermark": 50, "persistent": False},
    ]  # fmt: skip

    groups = admin(registry_uri, "groups").stdout
    assert "direct pay-succ, regex refund-.*" in groups
    groups_json = json.loads(admin(registry_uri, "--json", "groups").stdout)
    assert [(g["group"], len(g["bindings"])) for g in groups_json] == [("mail", 1), ("sms", 2)]

    missing = admin(
        registry_uri, "bindings", "remove", "--group", "sms", "--topic", "trade", "--type", "nope"
    )
    assert missing.returncode == 2 and "nothing removed" in missing.stderr
    removed = admin(registry_uri, "--json", "bindings", "remove", "--group", "sms", "--topic", "trade")
    assert removed.returncode == 0 and json.loads(removed.stdout)["removed"] == 2
    assert admin(registry_uri, "bindings", "list", "--group", "sms").stdout.strip() == "no bindings"


def test_servers_and_producers(registry_uri: str) -> None:
    async def register() -> None:
        async with open_registry(registry_uri) as registry:
            await registry.register_server("10.0.0.1:13800", ["trade", "order"])
            await registry.register_producer("10.0.0.9:1", "order-svc", ["trade"])
            # The CLI runs while this process still holds its (ephemeral) registrations.
            await trio.to_thread.run_sync(check_listing)

    def check_listing() -> None:
        servers = admin(registry_uri, "servers").stdout.splitlines()
        assert [line.split() for line in servers] == [
            ["TOPIC", "ADDRESS"],
            ["order", "10.0.0.1:13800"],
            ["trade", "10.0.0.1:13800"],
        ]
        only = json.loads(admin(registry_uri, "--json", "servers", "--topic", "trade").stdout)
        assert only == [{"topic": "trade", "address": "10.0.0.1:13800"}]
        producers = json.loads(admin(registry_uri, "--json", "producers").stdout)
        assert producers == [{"topic": "trade", "group": "order-svc", "address": "10.0.0.9:1"}]

    assert admin(registry_uri, "servers").stdout.strip() == "no brokers registered"
    trio.run(register)


def test_unreachable_zookeeper_fails_fast_and_clearly() -> None:
    port = free_port()
    started = time.monotonic()
    result = admin(f"zk://127.0.0.1:{port}", "bindings", "list")
    assert result.returncode == 2
    assert f"error: cannot reach ZooKeeper at 127.0.0.1:{port} within 5 s" in result.stderr
    assert time.monotonic() - started < 15
    assert "Traceback" not in result.stderr


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/registry.json"
    unknown = admin("etcd://x", "servers")
    assert unknown.returncode == 2 and "error: unknown registry URI" in unknown.stderr
    no_kind = admin(uri, "bindings", "add", "--group", "g", "--topic", "t")
    assert (
        no_kind.returncode == 2
        and "one of the arguments --direct --regex --fanout is required" in no_kind.stderr
    )
    bad_watermark = admin(
        uri, "bindings", "add", "--group", "g", "--topic", "t", "--fanout", "--watermark", "0"
    )
    assert bad_watermark.returncode == 2 and "error: watermark must be positive" in bad_watermark.stderr
    bad_regex = admin(uri, "bindings", "add", "--group", "g", "--topic", "t", "--regex", "(")
    assert bad_regex.returncode == 2 and "invalid regex" in bad_regex.stderr


def test_a_pattern_re2_refuses_is_refused_and_one_already_there_can_be_removed(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/registry.json"
    refused = admin(uri, "bindings", "add", "--group", "g", "--topic", "t", "--regex", r"(a)\1")
    assert refused.returncode == 2, refused.stdout
    assert refused.stderr.startswith(r"error: invalid regex '(a)\\1': invalid escape sequence: '\\1'")
    assert "RE2 syntax" in refused.stderr and "Traceback" not in refused.stderr
    assert admin(uri, "bindings", "list").stdout.strip() == "no bindings"

    # One written by a tool that checks nothing is listed, blocks nothing silently, and can be removed.
    bad = {"groupId": "g", "topic": "t", "messageType": r"(a)\1", "bindType": 1}
    (tmp_path / "registry.json").write_text(json.dumps({"bindings": {"t": {"g": [bad]}}}))
    assert "regex (a)\\1" in admin(uri, "groups").stdout
    blocked = admin(uri, "bindings", "add", "--group", "g", "--topic", "t", "--direct", "x")
    assert (
        blocked.returncode == 2
        and "which RE2 cannot compile" in blocked.stderr
        and "remove it" in blocked.stderr
    )
    removed = admin(uri, "bindings", "remove", "--group", "g", "--topic", "t", "--type", r"(a)\1")
    assert removed.returncode == 0, removed.stderr


def test_default_registry_is_the_local_file(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kiteq.cli.admin", "bindings", "add", "--group", "g", "--topic", "t", "--fanout"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        json.loads((tmp_path / "data" / "registry.json").read_text())["bindings"]["t"]["g"][0]["bindType"]
        == 2
    )


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("kiteq-admin")
    if not script.exists():
        pytest.skip("kiteq-admin is not installed in this environment (pip install -e .)")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "bindings" in result.stdout
