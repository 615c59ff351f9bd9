"""`kiteq-admin` registry commands, run as a user runs them, against zk:// and file://."""

from __future__ import annotations

import functools
import getpass
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from kiteq.cli.console import EXIT_CLOSED_PIPE
from kiteq.registry import open_registry
from kiteq.server.dead_reasons import DeadReason
from tests.helpers import running_broker
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
        registry_uri,
        "bindings",
        "add",
        "--group",
        "sms",
        "--topic",
        "trade",
        "--direct",
        "pay-succ",
        "--create",
    )
    assert added.returncode == 0, added.stderr
    assert "bound group sms to topic trade: direct pay-succ" in added.stdout
    added = admin(registry_uri, "bindings", "add", "--group", "sms", "--topic", "trade", "--json",
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

    async def create() -> None:
        async with open_registry(registry_uri):  # brokers and clients make the file when it is missing
            pass

    trio.run(create)
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
    (tmp_path / "registry.json").write_text("{}")
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
        [sys.executable, "-m", "kiteq.cli.admin", "bindings", "add", "--group", "g", "--topic", "t", "--fanout",
         "--create"],
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


def script(name: str) -> Path:
    """A console script of this environment, run as users run it."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        pytest.skip(f"{name} is not installed in this environment (pip install -e .)")
    return path


def test_global_options_are_accepted_anywhere(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/registry.json"
    wrong = f"file://{tmp_path}/elsewhere.json"
    assert (
        admin(uri, "bindings", "add", "--group", "g", "--topic", "t", "--fanout", "--create").returncode == 0
    )
    binding = {"groupId": "g", "topic": "t", "messageType": "*", "bindType": 2, "version": "1.0.0",
               "watermark": 1000, "persistent": True}  # fmt: skip
    for args in (
        ["--json", "--registry", uri, "groups"],
        ["groups", "--json", "--registry", uri],
        ["--registry", wrong, "groups", "--json", "--registry", uri],  # the later one wins
        ["--log-level", "error", "--registry", wrong, "groups", "--registry", uri, "--log-level", "debug", "--json"],
    ):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "kiteq.cli.admin", *args],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert result.returncode == 0, (args, result.stderr)
        assert json.loads(result.stdout) == [{"group": "g", "topic": "t", "bindings": [binding]}]
    # Two levels down, between the levels, and --token/--admin/--tls-ca after a dlq action.
    nested = admin(uri, "bindings", "--json", "list", "--group", "g")
    assert json.loads(nested.stdout)[0]["groupId"] == "g"
    unreachable = f"http://127.0.0.1:{free_port()}"
    dlq = admin(uri, "dlq", "purge", "--all", "--token", "x", "--admin", unreachable, "--tls-ca", "")
    assert dlq.returncode == 2 and f"cannot reach the broker's admin endpoint {unreachable}" in dlq.stderr


def test_a_registry_file_that_does_not_exist_is_an_error_until_created(tmp_path: Path) -> None:
    typo = f"file://{tmp_path}/registry.jsn"
    for command in (["bindings", "list"], ["servers"], ["producers"], ["groups"],
                    ["bindings", "remove", "--group", "g", "--topic", "t"]):  # fmt: skip
        result = admin(typo, *command)
        assert result.returncode == 2, command
        assert f"error: registry file {tmp_path}/registry.jsn does not exist" in result.stderr
        assert "--create" in result.stderr and "Traceback" not in result.stderr
    deep = f"file://{tmp_path}/not/yet/registry.json"
    refused = admin(deep, "bindings", "add", "--group", "g", "--topic", "t", "--fanout")
    assert refused.returncode == 2 and "does not exist" in refused.stderr
    assert list(tmp_path.iterdir()) == [], "nothing was created: no file, no directories"
    created = admin(deep, "bindings", "add", "--group", "g", "--topic", "t", "--fanout", "--create")
    assert created.returncode == 0, created.stderr
    assert admin(deep, "bindings", "list").stdout.splitlines()[1].split()[:2] == ["g", "t"]


def log_fields(line: str) -> dict[str, str]:
    """`key=value` pairs of one console-format log line (values without spaces)."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def test_binding_changes_are_audited_on_stderr(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/registry.json"
    added = admin(uri, "bindings", "add", "--group", "sms", "--topic", "trade", "--direct", "pay", "--create")
    assert added.returncode == 0 and added.stdout.startswith("bound group sms")  # stdout stays the result
    [line] = [line for line in added.stderr.splitlines() if "audit.binding_added" in line]
    assert log_fields(line) == {
        "bind": "direct", "count": "1", "group": "sms", "host": socket.gethostname(), "message_type": "pay",
        "persistent": "True", "registry": uri, "topic": "trade", "user": getpass.getuser(), "watermark": "1000",
    }  # fmt: skip
    admin(uri, "bindings", "add", "--group", "sms", "--topic", "trade", "--direct", "refund")
    removed = admin(uri, "bindings", "remove", "--group", "sms", "--topic", "trade", "--log-level", "error")
    [line] = [line for line in removed.stderr.splitlines() if "audit.binding_removed" in line]
    fields = log_fields(line)
    assert (fields["group"], fields["topic"], fields["count"], fields["registry"]) == (
        "sms",
        "trade",
        "2",
        uri,
    )
    nothing = admin(uri, "bindings", "remove", "--group", "sms", "--topic", "trade")
    assert nothing.returncode == 2 and "audit." not in nothing.stderr, "no change, no audit event"
    assert "audit." not in admin(uri, "bindings", "list").stderr


def test_producers_lists_only_live_ones(tmp_path: Path) -> None:
    """A producer killed with SIGKILL never withdraws; its heartbeat expires instead."""
    uri = f"file://{tmp_path}/registry.json?ttl=1"
    killed_code = (
        "import sys, trio\n"
        "from kiteq.registry import open_registry\n"
        "async def main():\n"
        f"    async with open_registry({uri!r}) as registry:\n"
        "        await registry.register_producer('killed:1', 'order-svc', ['trade'])\n"
        "        print('ready', flush=True)\n"
        "        await trio.sleep_forever()\n"
        "trio.run(main)\n"
    )

    def producers() -> list[str]:
        listed = admin(uri, "--json", "producers")
        assert listed.returncode == 0, listed.stderr
        return [row["address"] for row in json.loads(listed.stdout)]

    async def scenario() -> None:
        async with open_registry(uri) as registry:
            await registry.register_producer("live:1", "order-svc", ["trade"])
            child = subprocess.Popen(
                [sys.executable, "-c", killed_code], stdout=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
            assert sorted(await trio.to_thread.run_sync(producers)) == ["killed:1", "live:1"]
            child.kill()
            child.wait()
            with trio.fail_after(15):  # the TTL is 1 s; a busy machine may take a few polls
                while (found := await trio.to_thread.run_sync(producers)) != ["live:1"]:
                    assert "live:1" in found, "a live producer keeps heartbeating"
                    await trio.sleep(0.2)

    trio.run(scenario)


def test_dlq_filters_are_checked(tmp_path: Path) -> None:
    bogus = admin(f"file://{tmp_path}/r.json", "dlq", "list", "--reason", "bogus")
    assert bogus.returncode == 2
    assert "invalid choice: 'bogus'" in bogus.stderr
    for reason in DeadReason:
        assert f"'{reason}'" in bogus.stderr

    async def scenario() -> None:
        async with running_broker(tmp_path) as broker:
            url = f"http://{broker.admin_address}"
            run = functools.partial(admin, f"file://{tmp_path}/r.json", "--admin", url, "dlq")
            for action in ("redrive", "purge"):
                nothing = await trio.to_thread.run_sync(run, action, "--id", "deadbeef")
                assert nothing.returncode == 1, nothing.stderr
                assert f"{action}: no dead letter matches --id deadbeef; nothing changed" in nothing.stderr
                assert nothing.stdout.strip() == f"{action}: 0 message(s)"
                scripted = await trio.to_thread.run_sync(run, action, "--reason", "expired", "--json")
                assert scripted.returncode == 1 and json.loads(scripted.stdout)
                everything = await trio.to_thread.run_sync(run, action, "--all")
                assert everything.returncode == 0, "--all on an empty queue is not a mistake"
            listed = await trio.to_thread.run_sync(run, "list", "--topic", "nope")
            assert listed.returncode == 0 and listed.stdout.strip() == "no dead letter matches --topic nope"

    trio.run(scenario)


@pytest.mark.parametrize("name", ["kiteq-admin", "kiteq-server", "kiteq-reconcile"])
def test_every_console_script_prints_its_version(name: str) -> None:
    result = subprocess.run([str(script(name)), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{name} {importlib.metadata.version('kiteq-py')}"


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`kiteq-admin … | head -1` with the reader gone before the first write: no traceback."""
    uri = f"file://{tmp_path}/registry.json"
    assert (
        admin(uri, "bindings", "add", "--group", "g", "--topic", "t", "--fanout", "--create").returncode == 0
    )
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        for command in (["bindings", "list"], ["--json", "groups"]):
            result = subprocess.run(
                [str(script("kiteq-admin")), "--registry", uri, *command],
                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
            )  # fmt: skip
            assert (result.returncode, result.stderr) == (EXIT_CLOSED_PIPE, ""), command
    finally:
        os.close(write_end)
