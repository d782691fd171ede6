"""Unit tests of the Airflow provider: no database server, no Spark."""

from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from airflow_cdc.airflow.pipeline import PipelineSpec, literal_tables, load_pipeline, without_literal_secrets
from airflow_cdc.airflow.signals import signals_from_run
from airflow_cdc.airflow.state_variable import VariableStateStore
from airflow_cdc.core.errors import ConfigError, StateConflict
from airflow_cdc.core.state import StateCorrupt, open_state_store

EXEC = {
    "type": "execute-snapshot",
    "data": {
        "data-collections": ["public.orders"],
        "additional-conditions": [{"data-collection": "public.orders", "filter": "id <= 3"}],
    },
}


# -- signals from run conf and the trigger form --------------------------------------------------
def test_signals_debezium_conf_shapes():
    assert signals_from_run(EXEC, EXEC) == [EXEC]  # conf is merged into params too: no duplicate
    short = {"execute-snapshot": EXEC["data"]}
    assert signals_from_run(short, {}) == [EXEC]
    stop = {"type": "stop-snapshot", "data": {"data-collections": ["public.orders"]}}
    assert signals_from_run({"signals": [EXEC, stop]}, None) == [EXEC, stop]
    assert signals_from_run({}, {"snapshot_tables": [], "snapshot_filter": "", "stop_snapshot": False}) == []


def test_signals_from_trigger_form():
    form = {
        "snapshot_tables": ["public.orders", "public.customers"],
        "snapshot_filter": "id <= 3",
        "surrogate_key": "id",
        "stop_snapshot": False,
    }
    [sig] = signals_from_run(form, form)
    assert sig["type"] == "execute-snapshot"
    assert sig["data"]["data-collections"] == ["public.orders", "public.customers"]
    assert sig["data"]["additional-conditions"] == [
        {"data-collection": "public.orders", "filter": "id <= 3"},
        {"data-collection": "public.customers", "filter": "id <= 3"},
    ]
    assert sig["data"]["surrogate-key"] == "id"
    [stop] = signals_from_run({}, {"snapshot_tables": "public.orders", "stop_snapshot": True})
    assert stop == {
        "type": "stop-snapshot",
        "data": {"data-collections": ["public.orders"], "type": "incremental"},
    }


@pytest.mark.parametrize(
    "conf,params,needle",
    [
        ({"type": "execute-snapshot", "data": {}}, {}, "data-collections"),
        (
            {
                "type": "blah-snapshot",
                "data": {"data-collections": ["a.b"]},
                "signals": [{"type": "x", "data": {}}],
            },
            {},
            "not supported",
        ),
        ({"signals": "nope"}, {}, "must be a list"),
        ({}, {"snapshot_filter": "id > 1"}, "needs snapshot_tables"),
        (
            {"execute-snapshot": {"data-collections": ["a.b"], "additional-conditions": [{"filter": "x"}]}},
            {},
            "data-collection",
        ),
    ],
)
def test_signals_rejects_malformed(conf, params, needle):
    with pytest.raises(ConfigError, match=needle):
        signals_from_run(conf, params)


# -- pipeline files ------------------------------------------------------------------------------
def test_pipeline_section_split_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_T_ROOT", "/data/cdc")
    f = tmp_path / "p.yaml"
    f.write_text(
        "name: shop\nconnector: postgresql\ntable.include.list: public.orders,public\\.customers,s.t_.*\n"
        "database.password: ${env:CDC_T_PW}\nairflow:\n  target: ${env:CDC_T_ROOT}/delta\n  retries: 0\n"
    )
    spec = load_pipeline(f)
    assert "airflow" not in spec.properties
    assert spec.properties["database.password"] == "${env:CDC_T_PW}"  # left for the core (never copied)
    assert spec.option("target") == "/data/cdc/delta" and spec.option("retries") == 0
    assert spec.option("spark_conn_id") == "spark_default"
    assert literal_tables(spec) == ["public.orders", "public.customers"]
    assert literal_tables(PipelineSpec({"name": "x"}, {"tables": "a.b, c.d"})) == ["a.b", "c.d"]


def test_pipeline_errors(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: shop\nairflow:\n  targte: /x\n")
    with pytest.raises(ConfigError, match="did you mean 'target'"):
        load_pipeline(f)
    f.write_text("name: shop\nairflow:\n  target: ${env:CDC_T_SURELY_UNSET}\n")
    with pytest.raises(ConfigError, match="CDC_T_SURELY_UNSET"):
        load_pipeline(f)


def test_without_literal_secrets():
    props = {"name": "x", "database.password": "hunter2", "database.user": "u", "other.token": "${env:TOK}"}
    assert without_literal_secrets(props) == {"name": "x", "database.user": "u", "other.token": "${env:TOK}"}


# -- Variable state store (compare-and-set semantics on a dict standing in for Variables) ---------
class FakeVariables:
    def __init__(self):
        self.data: dict[str, str] = {}
        self.after_put = None

    def store(self, prefix="cdc."):
        def put(key, value):
            self.data[key] = value
            if self.after_put:
                hook, self.after_put = self.after_put, None
                hook()

        return VariableStateStore(prefix, get=self.data.get, put=put, delete=self.data.pop)


def test_variable_store_compare_and_set():
    fake = FakeVariables()
    store = fake.store()
    assert store.load("shop") is None
    assert store.compare_and_set("shop", None, {"offset": {"lsn": "0/10"}}) == 1
    record = json.loads(fake.data["cdc.shop"])
    assert record["state"] == {"offset": {"lsn": "0/10"}} and record["version"] == 1
    with pytest.raises(StateConflict, match="version 1, expected None"):
        store.compare_and_set("shop", None, {"offset": {"lsn": "0/20"}})
    assert store.compare_and_set("shop", 1, {"offset": {"lsn": "0/20"}}) == 2
    with pytest.raises(StateConflict):
        store.compare_and_set("shop", 1, {"offset": {"lsn": "0/30"}})
    loaded = store.load("shop")
    assert loaded is not None and loaded.version == 2 and loaded.data["offset"]["lsn"] == "0/20"
    store.delete("shop")
    assert store.load("shop") is None


def test_variable_store_detects_overwrite_by_concurrent_writer():
    fake = FakeVariables()
    store, other = fake.store(), fake.store()
    store.compare_and_set("shop", None, {"n": 1})
    # another writer commits between our write and our re-read: we must not report success
    fake.after_put = lambda: fake.data.__setitem__(
        "cdc.shop",
        json.dumps(
            {"connector": "shop", "version": 2, "updated_at": "", "token": "theirs", "state": {"n": 99}}
        ),
    )
    with pytest.raises(StateConflict, match="overwritten"):
        store.compare_and_set("shop", 1, {"n": 2})
    assert other.load("shop").data == {"n": 99}


def test_variable_store_corrupt_and_url():
    fake = FakeVariables()
    fake.data["cdc.shop"] = "not json"
    with pytest.raises(StateCorrupt):
        fake.store().load("shop")
    fake.data["cdc.shop"] = json.dumps({"connector": "other", "version": 1, "state": {}})
    with pytest.raises(StateCorrupt, match="does not match"):
        fake.store().load("shop")
    store = open_state_store("airflow-variable://?prefix=my.")
    assert isinstance(store, VariableStateStore) and store.key("shop") == "my.shop"


# -- provider packaging --------------------------------------------------------------------------
def test_provider_entry_point_and_classes():
    [ep] = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_cdc")]
    info = ep.load()()
    assert info["package-name"] == "airflow-cdc"
    types = {c["connection-type"]: c for c in info["connection-types"]}
    assert set(types) == {"cdcpostgres", "cdcmysql", "cdcsqlserver", "cdcvitess"}
    for c in types.values():
        module, _, name = c["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), name)
        assert hook.conn_type == c["connection-type"]
    for group in ("operators", "sensors", "triggers", "hooks"):
        for module in info[group][0]["python-modules"]:
            importlib.import_module(module)


def test_providers_manager_lists_connection_types():
    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    assert "airflow-cdc" in ProvidersManager().providers
    hook = ProvidersManagerTaskRuntime().hooks["cdcpostgres"]
    assert hook is not None and hook.hook_class_name == "airflow_cdc.airflow.hooks.cdc.CdcHook"


def test_hook_connection_properties_keep_password_secret():
    from airflow.sdk import Connection

    from airflow_cdc.airflow.hooks.cdc import connection_properties
    from airflow_cdc.core.pipeline import build_config

    conn = Connection(
        conn_id="c",
        conn_type="cdcpostgres",
        host="db",
        port=5433,
        login="cdc",
        password="s3cr3t",
        schema="shop",
        extra=json.dumps({"slot_name": "s1", "publication.name": "p1"}),
    )
    props = connection_properties(conn, "postgresql")
    config = build_config({**props, "name": "shop", "staging.path": "/tmp/x"})
    assert config["database.hostname"] == "db" and config["database.port"] == 5433
    assert config["slot.name"] == "s1" and config["publication.name"] == "p1"
    assert config.secret("database.password") == "s3cr3t"
    assert (
        "s3cr3t" not in repr(props) and "s3cr3t" not in repr(config) and "s3cr3t" not in str(config.items())
    )


def test_hook_maps_the_database_field_per_source():
    from airflow.sdk import Connection

    from airflow_cdc.airflow.hooks.cdc import connection_properties
    from airflow_cdc.core.pipeline import build_config

    conn = Connection(
        conn_id="m",
        conn_type="cdcmysql",
        host="db",
        port=3306,
        login="cdc",
        password="pw",
        schema="shop",
        extra=json.dumps({"server_id": 5401}),
    )
    config = build_config({**connection_properties(conn, "mysql"), "name": "m", "staging.path": "/tmp/x"})
    assert config["database.include.list"] == ("shop",) and config["database.server.id"] == 5401


# -- trigger serialization -----------------------------------------------------------------------
def test_trigger_serialize_round_trip():
    from airflow_cdc.airflow.triggers.changes import CdcChangesTrigger

    trigger = CdcChangesTrigger(
        pipeline="/p.yaml", offset={"lsn": "0/16B3748"}, cdc_conn_id="c", check="slot", poll_interval=5
    )
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # stored in the metadata DB: plain JSON only
    module, _, name = classpath.rpartition(".")
    clone = getattr(importlib.import_module(module), name)(**kwargs)
    assert clone.serialize() == (classpath, kwargs)
    assert kwargs == {
        "pipeline": "/p.yaml",
        "offset": {"lsn": "0/16B3748"},
        "cdc_conn_id": "c",
        "check": "slot",
        "poll_interval": 5.0,
        "partition": None,
        "timeout_at": None,
    }


# -- DAG factory ---------------------------------------------------------------------------------
def _pipeline(tmp_path: Path, extra: str = "") -> Path:
    f = tmp_path / "shop.yaml"
    f.write_text(
        "name: shop\nconnector: postgresql\ntable.include.list: public.customers,public.orders\n"
        f"staging.path: {tmp_path}/staging\nairflow:\n  target: {tmp_path}/delta\n  retries: 3\n{extra}"
    )
    return f


def test_dag_factory_shape(tmp_path):
    from airflow_cdc.airflow.dag_factory import cdc_dag

    dag = cdc_dag(_pipeline(tmp_path), schedule="@hourly")
    assert dag.dag_id == "cdc_shop" and dag.max_active_runs == 1
    assert {t.task_id for t in dag.tasks} == {"sense", "capture", "apply", "commit"}
    assert dag.get_task("sense").downstream_task_ids == {"capture"}
    # commit also hangs on capture: an empty batch skips apply, and its offset is still committed
    assert dag.get_task("capture").downstream_task_ids == {"apply", "commit"}
    assert dag.get_task("apply").downstream_task_ids == {"commit"}
    assert dag.get_task("commit").trigger_rule == "none_failed_min_one_success"
    assert all(t.retries == 3 for t in dag.tasks)
    outlets = dag.get_task("commit").outlets
    assert [a.name for a in outlets] == ["cdc.shop.public.customers", "cdc.shop.public.orders"]
    assert outlets[1].uri == f"file://{tmp_path}/delta/silver/shop/public.orders"
    assert set(dag.params) == {"snapshot_tables", "snapshot_filter", "surrogate_key", "stop_snapshot"}
    assert dag.get_task("apply")._conn_id == "spark_default"


def test_dag_factory_delta_settings_from_properties(tmp_path, monkeypatch):
    from airflow_cdc.airflow.dag_factory import cdc_dag

    monkeypatch.setenv("CDC_T_DATA", str(tmp_path))
    f = tmp_path / "d.yaml"
    f.write_text(
        "name: shop\nconnector: postgresql\ntable.include.list: public.orders\nstaging.path: /tmp/s\n"
        "delta.root: ${env:CDC_T_DATA}/lake\ndelta.delete.mode: soft\ndelta.bronze.enabled: 'false'\n"
        "delta.rewrite.ratio: '2.5'\n"
    )
    apply = cdc_dag(f).get_task("apply")
    assert apply.target == f"{tmp_path}/lake"
    assert apply.options.delete_mode == "soft" and apply.options.bronze is False
    assert apply.options.rewrite_ratio == 2.5 and "--rewrite-ratio" in apply.options.args()
    assert cdc_dag(f, target="/elsewhere").get_task("apply").target == "/elsewhere"
    f.write_text("name: shop\nconnector: postgresql\nstaging.path: /tmp/s\n")
    with pytest.raises(ConfigError, match="delta.root"):
        cdc_dag(f)


def test_dag_factory_options(tmp_path):
    from airflow_cdc.airflow.dag_factory import cdc_dag

    dag = cdc_dag(_pipeline(tmp_path, "  sense: false\n  verify: true\n"), dag_id="x")
    assert {t.task_id for t in dag.tasks} == {"capture", "apply", "commit", "verify"}
    dag = cdc_dag(_pipeline(tmp_path), apply=False, sense=False)
    assert {t.task_id for t in dag.tasks} == {"capture", "commit"} and dag.get_task("commit").outlets == []
    with pytest.raises(ConfigError, match="unknown option"):
        cdc_dag(_pipeline(tmp_path), retires=1)
    f = tmp_path / "nt.yaml"
    f.write_text("name: shop\nconnector: postgresql\nstaging.path: /tmp/s\n")
    with pytest.raises(ConfigError, match="Delta root"):
        cdc_dag(f)


def test_example_dag_parses(monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_CDC_DATA", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CDC_STATE_STORE", "airflow-variable://")
    bag = DagBag(dag_folder=str(Path(__file__).resolve().parents[2] / "dags"))
    assert not bag.import_errors, bag.import_errors
    for dag_id in ("cdc_postgres_shop", "cdc_mysql_shop", "cdc_vitess_commerce"):
        dag = bag.dags.get(dag_id)
        assert dag is not None and dag.max_active_runs == 1
        assert {t.task_id for t in dag.tasks} == {"sense", "capture", "apply", "commit"}
    assert [a.name for a in bag.dags["cdc_mysql_shop"].get_task("commit").outlets] == [
        "cdc.shop_mysql.shop.customers",
        "cdc.shop_mysql.shop.orders",
    ]


# -- verify operator (against a stand-in of airflow_cdc.apply.verify; the real one: test_end_to_end) ---
def test_verify_operator_fails_on_differences(monkeypatch, tmp_path):
    import sys
    import types

    from airflow.sdk.exceptions import AirflowFailException

    from airflow_cdc.airflow.operators.verify import CdcVerifyOperator

    calls = []

    class Report:
        def __init__(self, ok, differences):
            self.ok, self.differences = ok, differences

    module = types.ModuleType("airflow_cdc.apply.verify")
    outcome = {"report": Report(True, [])}

    def verify(config, target):
        calls.append((config["name"], target))
        return outcome["report"]

    module.verify = verify  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "airflow_cdc.apply.verify", module)
    props = {"name": "shop", "connector": "postgresql", "staging.path": str(tmp_path)}
    op = CdcVerifyOperator(task_id="verify", pipeline=props, target="/delta")
    assert op.execute({})["ok"] is True
    assert calls == [("shop", "/delta")]
    outcome["report"] = Report(False, ["public.orders: 2 rows differ"])
    with pytest.raises(AirflowFailException, match="2 rows differ"):
        op.execute({})


# -- issue 11: secrets, lease wiring, readable failures ---------------------------------------------
def test_hook_masks_state_store_password_in_airflow_logs():
    from airflow.sdk.log import _secrets_masker

    from airflow_cdc.airflow.hooks.cdc import CdcHook

    url = "postgresql://cdc:Store-Pw-42@meta:5432/db?table=t"
    props = CdcHook(pipeline={"name": "shop", "connector": "postgresql", "state.store": url}).properties()
    assert props["state.store"] == url
    masked = _secrets_masker().redact(f"opening {url} with Store-Pw-42")
    assert "Store-Pw-42" not in str(masked)
    trigger_safe = without_literal_secrets({"name": "x", "state.store": url, "staging.path": "/s"})
    assert trigger_safe == {"name": "x", "staging.path": "/s"}  # never stored in the metadata DB
    assert without_literal_secrets({"state.store": "sqlite:///x.db"}) == {"state.store": "sqlite:///x.db"}


def test_dag_factory_wires_lease_and_commit_target(tmp_path):
    from airflow_cdc.airflow.dag_factory import cdc_dag

    dag = cdc_dag(_pipeline(tmp_path))
    apply, commit = dag.get_task("apply"), dag.get_task("commit")
    assert apply.pipeline == commit.pipeline and apply.pipeline.endswith(".yaml")
    assert commit.target == str(tmp_path / "delta")


def test_non_retryable_failures_read_as_words():
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_cdc.airflow.errors import airflow_errors
    from airflow_cdc.core.errors import BatchNotApplied

    with pytest.raises(AirflowFailException) as err, airflow_errors("commit"):
        raise BatchNotApplied("batch b is not applied")
    text = str(err.value)
    assert "[needs_operator]" not in text and "commit failed (not retried: a person must act first)" in text


@pytest.mark.parametrize(
    ("code", "exc", "says"),
    [
        (-9, "AirflowException", "interrupted"),
        (137, "AirflowException", "interrupted"),
        (3, "Fail", "damaged"),
    ],
)
def test_apply_operator_says_what_a_spark_submit_exit_means(tmp_path, monkeypatch, code, exc, says):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_cdc.airflow.operators.apply import CdcApplyOperator
    from tests.unit.core.test_batch import _write

    batch = _write(tmp_path).finish({})

    def killed(self, context):
        raise AirflowException(f"Cannot execute: spark-submit --master local. Error code is: {code}.")

    monkeypatch.setattr(SparkSubmitOperator, "execute", killed)
    op = CdcApplyOperator(task_id="apply", batch_path=str(batch), target=str(tmp_path / "d"))
    with pytest.raises(AirflowException) as err:
        op.execute({})
    assert isinstance(err.value, AirflowFailException) == (exc == "Fail")
    assert says in str(err.value) and batch.name in str(err.value)
    if says == "interrupted":
        assert f"re-run apply for batch {batch.name}" in str(err.value) and "damaged" not in str(err.value)


def test_apply_operator_holds_the_lease_and_passes_its_token(tmp_path, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from airflow_cdc.airflow.operators.apply import CdcApplyOperator
    from airflow_cdc.core.lease import acquire
    from airflow_cdc.core.pipeline import build_config, build_store
    from tests.unit.core.test_batch import _write

    pipeline = {"name": "conn", "connector": "postgresql", "staging.path": str(tmp_path)}
    batch = _write(tmp_path).finish({})
    seen: dict = {}
    monkeypatch.setattr(
        SparkSubmitOperator, "execute", lambda self, ctx: seen.update(args=self.application_args)
    )
    op = CdcApplyOperator(
        task_id="apply", batch_path=str(batch), target=str(tmp_path / "d"), pipeline=pipeline
    )
    store = build_store(build_config(pipeline))
    other = acquire(store, "conn", "capture", 60)
    with pytest.raises(AirflowException) as err:  # busy connector: retried later, Spark never started
        op.execute({})
    assert not isinstance(err.value, AirflowFailException) and "held by capture on host" in str(err.value)
    assert seen == {}
    other.release()
    assert op.execute({})["applied"]
    assert seen["args"][-2:] == ["--fence", str(other.token + 1)]
    assert store.lease_store().load("conn").data["holder"] is None  # released after the job


def test_trigger_form_needs_nothing_for_a_plain_run_and_only_tables_for_a_snapshot(tmp_path):
    from airflow.sdk.definitions.param import ParamsDict

    from airflow_cdc.airflow.dag_factory import cdc_dag

    params = cdc_dag(_pipeline(tmp_path), schedule="@hourly").params
    # Airflow's form marks a field required unless its schema type admits null
    for name in ("snapshot_tables", "snapshot_filter", "surrogate_key"):
        assert "null" in params.get_param(name).schema["type"], name
    assert params.get_param("snapshot_tables").schema["format"] == "multiline"  # a text area, not a multi-select
    assert "public.orders" in params.get_param("snapshot_tables").description
    plain = ParamsDict({k: params.get_param(k) for k in params}).validate()
    assert signals_from_run({}, plain) == []
    form = ParamsDict({k: params.get_param(k) for k in params})
    form["snapshot_tables"] = "public.orders\npublic.customers"
    [sig] = signals_from_run({}, form.validate())
    assert sig == {"type": "execute-snapshot",
                   "data": {"data-collections": ["public.orders", "public.customers"], "type": "incremental"}}


def test_trigger_form_condition_field_describes_the_condition_language(tmp_path):
    from airflow_cdc.airflow.dag_factory import cdc_dag

    safe = cdc_dag(_pipeline(tmp_path), schedule="@hourly").params.get_param("snapshot_filter").description
    for part in ("Not SQL", "IS [NOT] NULL", "[NOT] IN", "BETWEEN", "AND, OR, NOT", "DATE 'YYYY-MM-DD'", "''"):
        assert part in safe, part
    (tmp_path / "raw").mkdir()
    raw_pipeline = _pipeline(tmp_path / "raw").read_text().replace(
        "airflow:", "snapshot.additional.conditions.raw.sql: true\nairflow:"
    )
    (tmp_path / "raw" / "shop.yaml").write_text(raw_pipeline)
    raw = cdc_dag(tmp_path / "raw" / "shop.yaml", schedule="@hourly").params.get_param("snapshot_filter").description
    assert "SQL condition" in raw and "snapshot.additional.conditions.raw.sql=true" in raw


@pytest.mark.parametrize(
    ("conn_type", "connector"),
    [("cdcpostgres", "postgresql"), ("cdcmysql", "mysql"), ("cdcsqlserver", "sqlserver"), ("cdcvitess", "vitess"),
     ("cdc_postgres", "postgresql"), ("cdc_mysql", "mysql"), ("cdc_sqlserver", "sqlserver")],
)  # fmt: skip
def test_connection_types_map_to_connectors_old_names_too(conn_type, connector):
    from airflow_cdc.airflow.hooks.cdc import CdcHook

    assert CdcHook._connector_for(conn_type) == connector


@pytest.mark.parametrize("legacy", [False, True])
def test_connection_types_are_rfc3986_schemes(capfd, legacy):
    """Airflow warns, each time it reads a Connection, when its type has ``_`` (not a URI scheme);
    the legacy ``cdc_*`` names show that the check sees the warning."""
    import re

    from airflow.models.connection import Connection

    from airflow_cdc.airflow.get_provider_info import get_provider_info

    for entry in get_provider_info()["connection-types"]:
        conn_type = entry["connection-type"].replace("cdc", "cdc_") if legacy else entry["connection-type"]
        uri = Connection(conn_id="c", conn_type=conn_type, host="db", login="u", password="p").get_uri()
        out = capfd.readouterr()
        assert ("RFC3986" in out.out + out.err) == legacy
        assert legacy or re.fullmatch(r"[a-z][a-z0-9+.]*", conn_type), conn_type
        assert Connection(conn_id="c", uri=uri).conn_type == conn_type  # the URI reads back as is


def test_docs_provider_reference_is_current_and_complete():
    """Every parameter of every provider class is documented, and the docs site
    (``docs/reference/operators.md``) shows the generated reference as it is now (run
    ``python scripts/operator_reference.py`` after changing one)."""
    import inspect
    import subprocess
    import sys

    from airflow_cdc.airflow.reference import CLASSES, _load, params_doc

    for path in CLASSES:
        cls = _load(path)
        names = [
            n
            for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        assert names and not set(names) - set(params_doc(cls)), f"{path}: undocumented parameters"
    root = Path(__file__).resolve().parents[2]
    check = subprocess.run(
        [sys.executable, str(root / "scripts" / "operator_reference.py"), "--check"],
        capture_output=True, text=True, cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
