"""`kiteq-server`'s flags: one per key of the config's tables, each overriding the file."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from kiteq.cli import server
from kiteq.config import BrokerConfig, DeliveryConfig, ServerConfig, TlsConfig, TxConfig

SECTIONS: dict[str, type] = {
    "server": ServerConfig,
    "tls": TlsConfig,
    "delivery": DeliveryConfig,
    "tx": TxConfig,
}
# Flags that scripts, tests and docs already use.
KNOWN_FLAGS = (
    "--config",
    "--bind",
    "--admin-bind",
    "--store",
    "--registry",
    "--delivery-log",
    "--topic",
    "--log-level",
    "--tls-cert",
    "--tls-key",
    "--tls-ca",
    "--tls-require-client-cert",
    "--tx-check-max",
)


def set_by_flag(flag: str, key: dataclasses.Field[Any], default: object) -> tuple[list[str], object]:
    """Arguments that set `key` through `--flag`, and the value they set: valid, and not the default."""
    if isinstance(default, bool):
        return [f"--{flag}" if not default else f"--no-{flag}"], not default
    if isinstance(default, list):
        return [f"--{flag}", "a", f"--{flag}", "b"], ["a", "b"]
    if "choices" in key.metadata:
        return [f"--{flag}", key.metadata["choices"][-1]], key.metadata["choices"][-1]
    if isinstance(default, int | float):
        return [f"--{flag}", str(default + 1)], default + 1
    return [f"--{flag}", "10.0.0.1:9"], "10.0.0.1:9"  # valid for every string key, host:port ones too


def test_every_key_has_a_flag_but_the_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    assert {f.name for f in dataclasses.fields(BrokerConfig)} == {*SECTIONS, "auth", "acl"}
    flags = {(section, key.name): flag for flag, section, key, _ in server.config_flags()}
    argv: list[str] = []
    expected: dict[tuple[str, str], object] = {}
    defaults = BrokerConfig()
    for section, kind in SECTIONS.items():
        for key in dataclasses.fields(kind):
            if key.metadata.get("secret"):
                assert (section, key.name) not in flags
                continue
            assert key.metadata["doc"], f"[{section}] {key.name} has no description"
            default = getattr(getattr(defaults, section), key.name)
            arguments, expected[(section, key.name)] = set_by_flag(flags[(section, key.name)], key, default)
            argv += arguments
    assert len(flags) == len(expected)

    config = server.config_from_argv(argv)
    for (section, name), value in expected.items():
        assert getattr(getattr(config, section), name) == value, f"[{section}] {name}"

    with pytest.raises(SystemExit) as exit:
        server.main(["--help"])
    out = capsys.readouterr().out
    assert exit.value.code == 0
    assert all(flag in out for flag in KNOWN_FLAGS)
    assert "[auth], [acl.GROUP]" in out and "[server] admin_token" in out and "--admin-token" not in out


def test_a_flag_overrides_the_file_and_the_rest_of_the_file_stays(tmp_path: Path) -> None:
    path = tmp_path / "kiteq.toml"
    path.write_text(
        '[server]\nbind = "127.0.0.1:1"\ntopics = ["a"]\nlog_level = "debug"\nadmin_token = "t"\n'
        '[auth]\norder-svc = "s3cret"\n'
        '[tls]\ncert = "b.pem"\nkey = "b.key"\nca = "ca.pem"\nrequire_client_cert = true\n'
        "[tx]\ntx_check_max = 3\n"
    )
    flags = "--bind 127.0.0.1:2 --topic b --topic c --no-tls-require-client-cert --tx-check-max 4"
    config = server.config_from_argv(["--config", str(path), *flags.split()])
    assert (config.server.bind, config.server.topics) == ("127.0.0.1:2", ["b", "c"])
    assert (config.tls.require_client_cert, config.tx.tx_check_max) == (False, 4)
    assert (config.server.log_level, config.server.admin_token, config.tls.cert) == ("debug", "t", "b.pem")
    assert config.auth == {"order-svc": "s3cret"}


def test_bad_values_exit_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert server.main(["--retry-base", "500"]) == 2
    assert "[delivery] retry_base" in capsys.readouterr().err
    for argv in (["--max-connections", "many"], ["--log-level", "loud"], ["--admin-token", "t"]):
        with pytest.raises(SystemExit) as exit:
            server.main(argv)
        assert exit.value.code == 2
