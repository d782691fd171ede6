"""Every property the Debezium docs document is supported, ignored with a reason, or refused with
what to use instead; the generated tables of the docs site (``docs/reference/properties/``) are current."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.property_status import handling
from airflow_cdc.core.source import resolve_connector
from airflow_cdc.sources.postgres.client import connect_params
from airflow_cdc.sources.property_table import BASE_CONFIGS, concrete, properties, rows

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "property_table_script", ROOT / "scripts" / "property_table.py"
)
assert _spec and _spec.loader
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)

CASES = [(c, n) for c in BASE_CONFIGS for n in script.documented(c)]


def build(connector: str, extra: dict) -> object:
    return resolve_connector({"connector": connector})[1].build_config({**BASE_CONFIGS[connector], **extra})


def test_seed_lists_are_checked_in_and_not_empty():
    for connector in BASE_CONFIGS:
        names = script.documented(connector)
        assert len(names) > 40, connector
        assert "table.include.list" in names and "snapshot.mode" in names


@pytest.mark.parametrize("connector,name", CASES, ids=[f"{c}:{n}" for c, n in CASES])
def test_every_documented_property_has_a_row_and_behaves_as_it_says(connector, name, caplog):
    table = {r.name: r for r in rows(connector, script.documented(connector))}
    assert name in table, f"{connector}: {name} missing from the property table"
    row = table[name]
    if row.status == "supported":
        return  # its parsing is covered by the connector's config tests
    caplog.set_level(logging.WARNING)
    value = "definitely-not-default"
    if row.status == "ignored":
        build(connector, {concrete(name): value})
        assert any(
            repr(concrete(name)) in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records
        )
    else:
        with pytest.raises(ConfigError) as err:
            build(connector, {concrete(name): value})
        assert repr(concrete(name)) in str(err.value) or concrete(name) in str(err.value)
        assert "unknown property" not in str(err.value)
        assert row.text, "a refusal says what to use instead"


@pytest.mark.parametrize("connector", list(BASE_CONFIGS))
def test_docs_property_table_is_current(connector):
    page = (ROOT / script.page_path(connector)).read_text(encoding="utf-8")
    assert script.rendered(connector, page) == page, "run: python scripts/property_table.py"


def test_docs_check_fails_when_stale(tmp_path, monkeypatch):
    path = script.page_path("postgresql")
    page = (ROOT / path).read_text(encoding="utf-8")
    stale = page.replace("| `slot.name` | supported |", "| `slot.name` | refused |", 1)
    assert stale != page
    for connector in BASE_CONFIGS:
        copy = tmp_path / script.page_path(connector)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text((ROOT / script.page_path(connector)).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / path).write_text(stale, encoding="utf-8")
    (tmp_path / "docs" / "seed_properties").symlink_to(ROOT / "docs" / "seed_properties")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    assert script.main(["--check"]) == 1
    assert (tmp_path / path).read_text(encoding="utf-8") == stale  # --check writes nothing


@pytest.mark.parametrize(
    "name,status",
    [
        ("slot.stream.params", "refused"),
        ("snapshot.mode.configuration.based.snapshot.data", "refused"),
        ("snapshot.select.statement.overrides.public.orders", None),  # supported: not in the tables
        ("topic.prefix.extra", "ignored"),
        ("key.converter.schemas.enable", "ignored"),
        ("no.such.thing", None),
    ],
)
def test_templated_and_prefixed_names_match(name, status):
    found = handling(name)
    assert (found.status if found else None) == status


def test_failure_mode_accepts_only_fail(caplog):
    caplog.set_level(logging.WARNING)
    build("postgresql", {"event.processing.failure.handling.mode": "FAIL"})
    with pytest.raises(ConfigError, match=r"'event.processing.failure.handling.mode'.*only `fail`"):
        build("postgresql", {"event.processing.failure.handling.mode": "skip"})


def test_refusal_names_the_alternative():
    with pytest.raises(ConfigError, match=r"'slot.stream.params' is not supported: .*fixed \(proto_version"):
        build("postgresql", {"slot.stream.params": "proto_version=2"})


def test_postgres_client_certificates_reach_libpq_and_the_key_password_stays_secret():
    config = build(
        "postgresql",
        {
            "database.sslmode": "verify-full",
            "database.sslcert": "/c/client.crt",
            "database.sslkey": "/c/client.key",
            "database.sslrootcert": "/c/ca.crt",
            "database.sslpassword": "s3cret-key-pw",
        },
    )
    params = connect_params(config, "t")
    assert params["sslcert"] == "/c/client.crt" and params["sslkey"] == "/c/client.key"
    assert params["sslrootcert"] == "/c/ca.crt" and params["sslpassword"] == "s3cret-key-pw"
    assert "s3cret-key-pw" not in repr(config)
    assert "sslcert" not in connect_params(build("postgresql", {}), "t")


def test_supported_rows_are_the_connector_properties():
    for connector in BASE_CONFIGS:
        supported = [r.name for r in rows(connector, []) if r.status == "supported"]
        assert supported == [p.name for p in properties(connector)]
