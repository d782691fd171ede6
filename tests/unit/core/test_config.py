"""Connector configuration: defaults, validation messages, env expansion, secrets, Kafka-only
properties and typo suggestions."""

from __future__ import annotations

import logging

import pytest

from airflow_cdc.core.config import Secret, skipped_ops, split_list
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.sources.postgres.config import PG_PROPERTIES, pg_config

BASE = {"name": "c1", "staging.path": "/tmp/staging"}


def cfg(**props):
    return pg_config({**BASE, **{k.replace("__", "."): v for k, v in props.items()}})


def test_defaults():
    c = cfg()
    assert c["snapshot.mode"] == "initial"
    assert c["skipped.operations"] == ("t",)
    assert c["slot.name"] == "debezium" and c["publication.name"] == "dbz_publication"
    assert c["publication.autocreate.mode"] == "all_tables"
    assert c["publish.via.partition.root"] is False
    assert c["plugin.name"] == "pgoutput"
    assert c["incremental.snapshot.chunk.size"] == 1024
    assert c["decimal.handling.mode"] == "precise" and c["time.precision.mode"] == "adaptive"
    assert c["table.include.list"] == () and c["message.key.columns"] is None
    assert c["database.hostname"] == "127.0.0.1" and c["database.port"] is None
    assert c["staging.retention.batches"] == 50
    assert not c.is_set("snapshot.mode")
    with pytest.raises(KeyError):
        c["no.such.property"]


def test_missing_required():
    with pytest.raises(ConfigError, match=r"missing required properties: name, staging\.path"):
        pg_config({})
    with pytest.raises(ConfigError, match=r"missing required property: staging\.path"):
        pg_config({"name": "x"})


@pytest.mark.parametrize("prop", [p for p in PG_PROPERTIES if p.kind == "enum"], ids=lambda p: p.name)
def test_every_enum_rejects_bad_value_naming_the_property(prop):
    with pytest.raises(ConfigError) as err:
        cfg(**{prop.name: "definitely-not-valid"})
    text = str(err.value)
    assert repr(prop.name) in text and "'definitely-not-valid'" in text
    assert "allowed values: " + ", ".join(prop.choices) in text


@pytest.mark.parametrize("prop", [p for p in PG_PROPERTIES if p.kind == "enum"], ids=lambda p: p.name)
def test_every_enum_accepts_each_choice_case_insensitively(prop):
    for choice in prop.choices:
        assert cfg(**{prop.name: choice.upper()})[prop.name] == choice


def test_enum_aliases():
    assert cfg(**{"snapshot.mode": "never"})["snapshot.mode"] == "no_data"
    assert cfg(**{"snapshot.mode": "schema_only"})["snapshot.mode"] == "no_data"


@pytest.mark.parametrize(
    "prop,value,match",
    [
        ("database.port", "abc", r"'database.port': invalid value 'abc' \(expected int\)"),
        ("database.port", "0", r"'database.port': 0 is below the minimum 1"),
        ("delta.rewrite.ratio", "lots", r"'delta.rewrite.ratio': invalid value 'lots' \(expected float\)"),
        ("delta.rewrite.ratio", "-1", r"'delta.rewrite.ratio': -1.0 is below the minimum 0"),
        ("delta.rewrite.ratio", "nan", r"'delta.rewrite.ratio': invalid value 'nan'"),
        (
            "incremental.snapshot.chunk.size",
            "0",
            r"'incremental.snapshot.chunk.size': 0 is below the minimum 1",
        ),
        ("publish.via.partition.root", "maybe", r"'publish.via.partition.root': invalid value 'maybe'"),
        ("run.max.events", True, r"'run.max.events'"),
    ],
)
def test_typed_values_validated(prop, value, match):
    with pytest.raises(ConfigError, match=match):
        cfg(**{prop: value})


def test_typed_values_parsed():
    c = cfg(
        **{
            "database.port": " 5433 ",
            "publish.via.partition.root": "yes",
            "table.include.list": r"public.a, public.b\,c ,",
            "include.unknown.datatypes": "0",
        }
    )
    assert c["database.port"] == 5433 and c["publish.via.partition.root"] is True
    assert c["table.include.list"] == ("public.a", "public.b,c")
    assert c["include.unknown.datatypes"] is False
    assert split_list(["a", " ", "b "]) == ("a", "b")


def test_env_expansion(monkeypatch):
    monkeypatch.setenv("CDC_TEST_HOST", "db.example")
    monkeypatch.setenv("CDC_TEST_PW", "s3cr3t-value")
    c = cfg(
        **{
            "database.hostname": "${env:CDC_TEST_HOST}",
            "slot.name": "pre_${env:CDC_TEST_HOST}_post",
            "database.password": "${env:CDC_TEST_PW}",
        }
    )
    assert c["database.hostname"] == "db.example"
    assert c["slot.name"] == "pre_db.example_post"
    assert c.secret("database.password") == "s3cr3t-value"


def test_env_expansion_missing_variable(monkeypatch):
    monkeypatch.delenv("CDC_TEST_MISSING", raising=False)
    with pytest.raises(ConfigError, match=r"'database.user'.*'CDC_TEST_MISSING'.*not set"):
        cfg(**{"database.user": "${env:CDC_TEST_MISSING}"})


def test_secret_never_shown(monkeypatch):
    monkeypatch.setenv("CDC_TEST_PW2", "env-secret-xyz")
    for raw in ("plain-secret-xyz", "${env:CDC_TEST_PW2}"):
        c = cfg(**{"database.password": raw})
        value = c.secret("database.password")
        assert value in ("plain-secret-xyz", "env-secret-xyz")
        for text in (
            repr(c),
            str(c),
            repr(c.items()),
            str(c["database.password"]),
            repr(c["database.password"]),
            f"{c['database.password']}",
        ):
            assert value not in text
        assert isinstance(c["database.password"], Secret)
    assert Secret("a") == Secret("a") and Secret("a") != Secret("b")


def test_kafka_only_properties_ignored_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="airflow_cdc.core.config"):
        c = cfg(
            **{
                "key.converter": "org.apache.kafka.connect.json.JsonConverter",
                "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
                "tasks.max": "1",
                "tombstones.on.delete": "false",
            }
        )
    warned = " ".join(r.getMessage() for r in caplog.records)
    for name in ("key.converter", "transforms.unwrap.type", "tasks.max", "tombstones.on.delete"):
        assert repr(name) in warned
        with pytest.raises(KeyError):
            c[name]
    assert "Kafka" in warned


@pytest.mark.parametrize(
    "typo,suggestion",
    [
        ("table.include.lst", "table.include.list"),
        ("slot.nam", "slot.name"),
        ("snapshot.mod", "snapshot.mode"),
    ],
)
def test_unknown_property_suggestion(typo, suggestion):
    with pytest.raises(ConfigError, match=rf"unknown property '{typo}'; did you mean '{suggestion}'\?"):
        cfg(**{typo: "x"})


def test_unknown_property_without_close_match():
    with pytest.raises(ConfigError) as err:
        cfg(**{"zzzzqqq": "x"})
    assert str(err.value).startswith("unknown property 'zzzzqqq'") and "did you mean" not in str(err.value)


def test_skipped_ops():
    assert skipped_ops(cfg()) == frozenset({"t"})
    assert skipped_ops(cfg(**{"skipped.operations": "none"})) == frozenset()
    assert skipped_ops(cfg(**{"skipped.operations": "C, d"})) == frozenset({"c", "d"})
    with pytest.raises(ConfigError, match=r"'skipped.operations'.*\['x'\]"):
        skipped_ops(cfg(**{"skipped.operations": "c,x"}))


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ({"connector": "mariadb"}, "mariadb"),
        ({"connector.class": "io.debezium.connector.mariadb.MariaDbConnector"}, "mariadb"),
        ({"connector": "MySQL"}, "mysql"),
        ({"connector.class": "io.debezium.connector.mysql.MySqlConnector"}, "mysql"),
        ({"connector": "postgres"}, "postgresql"),
    ],
)
def test_connector_kind_keeps_mariadb_apart(raw, kind):
    """MariaDB is served by the MySQL source but stays ``mariadb`` (source.connector needs it)."""
    from airflow_cdc.core.pipeline import build_config, build_source

    config = build_config({**BASE, "database.hostname": "h", "database.user": "u", **raw})
    assert config["connector"] == kind
    assert type(build_source(config)).__name__ == ("PostgresSource" if kind == "postgresql" else "MySqlSource")
