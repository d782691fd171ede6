"""State and staging stay private (0600/0700 whatever the umask); secrets never reach output."""

from __future__ import annotations

import logging
import os
import stat

import pytest
import yaml

from airflow_cdc import cli
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.lease import acquire
from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.core.redact import redact_url, secrets_in
from airflow_cdc.core.state import open_state_store
from airflow_cdc.core.state_file import FileStateStore

PASSWORD = "Hunter2-s3cret"
URL = f"postgresql://cdc:{PASSWORD}@127.0.0.1:1/meta?table=cdc_state&connect_timeout=2"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_state_files_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        store = FileStateStore(tmp_path / "a" / "state")
        store.compare_and_set("shop", None, {"offset": 1})
        store.compare_and_set("shop", 1, {"offset": 2})
        acquire(store, "shop", "capture", 30).release()
    finally:
        os.umask(old)
    leases = tmp_path / "a" / "state" / "_leases"
    for d in (tmp_path / "a", tmp_path / "a" / "state", leases):
        assert _mode(d) == 0o700, d
    files = list((tmp_path / "a" / "state").rglob("*.*"))
    assert {p.name for p in files} >= {"shop.json", "shop.lock"} and (leases / "shop.json") in files
    for p in files:
        assert _mode(p) == 0o600, p


def test_state_store_url_is_a_secret_in_the_config(tmp_path, caplog):
    config = build_config(
        {"name": "shop", "connector": "postgresql", "staging.path": str(tmp_path), "state.store": URL}
    )
    assert config.secret("state.store") == URL
    shown = [repr(config), str(config["state.store"]), repr(config.items())]
    for text in shown:
        assert PASSWORD not in text
    assert "postgresql://cdc:****@127.0.0.1:1/meta" in repr(config)
    assert PASSWORD not in build_store(config).describe()
    with pytest.raises(ConfigError) as err:
        build_config(
            {"name": "x", "connector": "postgresql", "staging.path": "/s", "state.store": 5, "bogus": 1}
        )
    assert PASSWORD not in str(err.value)
    with pytest.raises(ConfigError) as err:
        open_state_store(f"file://cdc:{PASSWORD}@host/x")
    assert PASSWORD not in str(err.value) and "cdc:****@host" in str(err.value)
    assert PASSWORD not in caplog.text


def test_redact_url_masks_passwords_and_secret_query_values():
    assert redact_url("mysql://u:p%40ss@h/db?password=x&sslmode=require") == (
        "mysql://u:****@h/db?password=****&sslmode=require"
    )
    assert redact_url("sqlite:///tmp/a.db") == "sqlite:///tmp/a.db"
    assert redact_url("/plain/dir") == "/plain/dir"
    assert secrets_in(
        {"state.store": URL, "database.password": "pw", "database.sslpassword": "k", "x": "y"}
    ) == [
        PASSWORD,
        URL,
        "pw",
        "k",
    ]


def test_cli_never_prints_the_state_store_password(tmp_path, capsys, caplog):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        yaml.safe_dump(
            {
                "name": "shop",
                "connector": "postgresql",
                "staging.path": str(tmp_path / "staging"),
                "state.store": URL,
                "database.password": "dbpass-XYZ",
            }
        )
    )
    with caplog.at_level(logging.DEBUG):
        code = cli.main(["status", "--config", str(pipeline)])  # the store is unreachable: an error
    out, err = capsys.readouterr()
    assert code != 0
    for text in (out, err, caplog.text):
        assert PASSWORD not in text and "dbpass-XYZ" not in text
    assert cli.scrub(f"x {URL} y", secrets_in({"state.store": URL})) == "x **** y"
