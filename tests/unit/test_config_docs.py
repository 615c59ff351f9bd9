"""docs/configuration.md is generated from kiteq/config.py and must be kept up to date."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from kiteq.cli.server import config_flags
from kiteq.config import load_config, table_keys
from kiteq.config_docs import main, render
from tests.procs.runner import ROOT

PAGE = ROOT / "docs" / "configuration.md"


def test_committed_page_is_up_to_date() -> None:
    assert PAGE.read_text() == render(), "docs/configuration.md is stale: run `make docs` and commit it"


def test_every_key_has_its_row_with_flag_default_and_meaning() -> None:
    page = render()
    flags = {(section, key.name): flag for flag, section, key, _ in config_flags()}
    for section, key, _ in table_keys():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{key.name}` |"))
        shown_flag = f"`--{flags[section, key.name]}`" if (section, key.name) in flags else "file only"
        assert shown_flag in row, row
        assert key.metadata["doc"].replace("|", "\\|") in row, row
    assert "| `admin_token` | file only |" in page
    assert "`67108864` (64 MiB)" in page and "PATH.5" in page


def test_the_example_file_in_the_page_loads(tmp_path: Path) -> None:
    example = re.search(r"```toml\n(.*?)```", render(), re.DOTALL)
    assert example is not None
    path = tmp_path / "kiteq.toml"
    path.write_text(example.group(1))
    config = load_config(path)
    assert tomllib.loads(example.group(1))["server"]["log_format"] == config.server.log_format == "json"
    assert config.auth == {"order-svc": "s3cret", "sms-svc": "s3cret"}


def test_main_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    assert main([str(out)]) == 0
    assert out.read_text() == render()
    assert main([]) == 2
