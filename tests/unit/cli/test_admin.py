"""kiteq-admin's frame: output helpers and how command modules are assembled."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

import kiteq.cli.admin as admin
from kiteq.cli.admin.output import emit, format_table, say


def test_table_is_aligned_and_readable() -> None:
    rows = [
        {"group": "sms", "bindings": ["direct a", "regex b.*"], "persistent": True, "note": None},
        {"group": "mail-service", "bindings": [], "persistent": False, "note": 7},
    ]
    assert format_table(rows).splitlines() == [
        "GROUP         BINDINGS             PERSISTENT  NOTE",
        "sms           direct a, regex b.*  yes         -",
        "mail-service                       no          7",
    ]
    assert format_table(rows, ["persistent", "group"]).splitlines()[0] == "PERSISTENT  GROUP"


def test_emit_and_say(capsys: pytest.CaptureFixture[str]) -> None:
    people, scripts = argparse.Namespace(json=False), argparse.Namespace(json=True)
    emit(people, [], empty="no bindings")
    emit(scripts, [])
    emit(scripts, [{"a": 1}], data={"full": True})
    say(people, "done", {"ok": True})
    say(scripts, "done", {"ok": True})
    out = capsys.readouterr().out
    assert out.startswith("no bindings\n[]\n")
    assert '"full": true' in out and "done\n" in out and '"ok": true' in out
    assert json.loads(out.split("done\n")[1]) == {"ok": True}


def test_help_and_usage_errors_are_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin.main(["--help"]) == 0
    assert "bindings" in capsys.readouterr().out
    assert admin.main([]) == 2
    assert admin.main(["bindings", "add", "--group", "g"]) == 2


def test_missing_command_modules_are_skipped_but_broken_ones_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin, "COMMAND_MODULES", ("registry_cmds", "not_written_yet_cmds"))
    parser = admin.build_parser()
    for command in (["bindings", "list"], ["servers"], ["producers"], ["groups"]):
        assert callable(parser.parse_args(command).func)

    (tmp_path / "broken_cmds.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.setattr(admin, "__path__", [*admin.__path__, str(tmp_path)])
    monkeypatch.setattr(admin, "COMMAND_MODULES", ("registry_cmds", "broken_cmds"))
    try:
        with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
            admin.build_parser()
    finally:
        sys.modules.pop("kiteq.cli.admin.broken_cmds", None)


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "--token", "t", "--registry", "zk://h:1", "dlq", "list"],
        ["dlq", "--json", "--token", "t", "list", "--registry", "zk://h:1"],
        ["dlq", "list", "--json", "--token", "t", "--registry", "zk://h:1"],
        ["--registry", "file://x", "--json", "dlq", "list", "--token", "t", "--registry", "zk://h:1"],
    ],
)
def test_global_options_parse_at_every_level_the_last_one_winning(argv: list[str]) -> None:
    args = admin.build_parser().parse_args(argv)
    assert (args.json, args.token, args.registry) == (True, "t", "zk://h:1")
    assert (args.admin, args.tls_ca, args.log_level) == (admin.DEFAULT_ADMIN, None, "error"), "defaults stay"


def test_version_and_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kiteq-admin ")
    assert admin.main(["dlq", "purge", "--reason", "expird"]) == 2
    assert "choose from 'expired', 'deliver-limit', 'no-binding', 'tx-unresolved'" in capsys.readouterr().err
