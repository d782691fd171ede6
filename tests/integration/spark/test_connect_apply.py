"""The apply job as a Spark Connect client (``spark.remote``), on local disk and on S3.

The job runs in a subprocess as a Connect client, as ``airflow-cdc apply`` runs it: no JVM of its
own, every Delta operation as SQL (``deltasql``), bronze's staged files and marks committed by the
client itself (``log_commit``).  The
same batches applied through a classic session must give the same Delta tables row by row
(silver, tombstones, history, the bronze events), silver must equal the source, a re-run must
write nothing, and a SIGKILL of the client or of the Connect server mid-apply must be repaired by
running the batch again.  Staged batches and Delta tables are on s3proxy; the server reaches them
with its own S3A settings, the client with the environment's (its own log reads).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from airflow_cdc.apply.submit import ApplyOptions, apply_exit_error, build_apply_job
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import ApplyInterrupted, ConfigError, StorageUnavailable
from airflow_cdc.testing.s3proxy import S3ProxyServer, configure_spark, s3a_conf, s3proxy_jar
from airflow_cdc.testing.spark_connect import SparkConnectServer
from spark_jobs.cdc_apply import delta_log
from spark_jobs.cdc_apply.catalog import CatalogError
from spark_jobs.cdc_apply.job import ApplySettings, apply_batches
from spark_jobs.cdc_apply.layout import EXIT_REMOTE, EXIT_STORAGE, app_id, table_path
from tests.integration.postgres.support import pipeline, run_capture, source_rows
from tests.integration.spark.support import diff, normalised_rows, semantic_names, silver_rows
from tests.integration.spark.test_apply_basic import ROW, TYPES_DDL

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HISTORY = ("public\\.h",)
TABLES = ("public.v", "public.h", "public.tz")


@pytest.fixture(scope="module")
def s3() -> Iterator[S3ProxyServer]:
    if s3proxy_jar() is None:
        pytest.skip("s3proxy jar or java missing: run `make setup`")
    with S3ProxyServer() as server:
        yield server


@pytest.fixture(scope="module")
def connect(s3: S3ProxyServer) -> Iterator[SparkConnectServer]:
    """One warm Connect server for the module, with S3A pointed at the test's s3proxy and Python
    UDFs on this interpreter (the job's VariableScaleDecimal conversion is one)."""
    conf = {f"spark.hadoop.{k}": v for k, v in s3a_conf(s3).items()}
    server = SparkConnectServer(master="local[2]", conf=conf, env={"PYSPARK_PYTHON": sys.executable})
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def on_s3(s3: S3ProxyServer, spark: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; this process (capture, the client's log reads) and the classic session
    reach it as a deployment's environment and Hadoop settings would."""
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    configure_spark(spark, s3)
    return f"s3a://{s3.make_bucket()}"


def _exec(db: Any, *statements: str) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _run_remote(
    paths: list[str], target: str, url: str, catalog: str | None = None, **env: str
) -> subprocess.CompletedProcess[bytes]:
    """The Connect client job for ``paths`` (its own process group: a fail point kills only it)."""
    job = build_apply_job(paths, target, options=ApplyOptions(history=HISTORY, catalog=catalog), remote=url)
    assert job.remote == url and job.jars is None and job.packages is None
    assert job.command()[0] == sys.executable  # no spark-submit, no JVM on this side
    return subprocess.run(
        job.command(),
        env={**os.environ, **job.env, "AIRFLOW_CDC_CONNECT_RETRY_SECONDS": "20", **env},
        start_new_session=True,
        capture_output=True,
        timeout=900,
    )


def _ok(proc: subprocess.CompletedProcess[bytes]) -> None:
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")[-4000:]


def _scenario(db: Any, staging: str, state: Any) -> dict[str, Any]:
    """Three batches: a snapshot; updates, deletes, key changes and unchanged TOAST values; an
    added column.  Every type of test_apply_basic, a history table, a TOAST table."""
    _exec(
        db,
        TYPES_DDL,
        "INSERT INTO v VALUES " + ROW % 1,
        "INSERT INTO v VALUES " + ROW % 2,
        "CREATE TABLE h (id int PRIMARY KEY, v text, n int)",
        "INSERT INTO h SELECT g, 'h' || g, g FROM generate_series(1, 30) g",
        "CREATE TABLE tz (id int PRIMARY KEY, big text, small int)",
        "ALTER TABLE tz ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO tz SELECT g, repeat(md5(g::text), 400), g FROM generate_series(1, 5) g",
    )
    config = pipeline(db, staging, state__store=str(state))  # offsets never live in the bucket
    run_capture(config)
    _exec(
        db,
        "INSERT INTO v VALUES " + ROW % 3,
        "UPDATE v SET txt = 'y', n = 99.99 WHERE id = 1",
        "UPDATE v SET id = 20 WHERE id = 2",
        "DELETE FROM v WHERE id = 3",
        "INSERT INTO v (id, nv, tstz) VALUES (4, -12345678901234567890.123456789, '1970-01-01 00:00:00+00')",
        "UPDATE h SET v = 'changed' WHERE id <= 10",
        "DELETE FROM h WHERE id > 25",
        "UPDATE tz SET small = small + 100",  # big unchanged: an unchanged-TOAST placeholder
    )
    run_capture(config)
    _exec(
        db,
        "ALTER TABLE h ADD COLUMN extra numeric(12, 3)",
        "UPDATE h SET extra = id * 1.5, n = n * 2 WHERE id % 3 = 0",
        "INSERT INTO h VALUES (100, 'new', 1, 2.5)",
        "UPDATE tz SET big = 'short now' WHERE id = 1",
        "DELETE FROM v WHERE id = 4",
    )
    run_capture(config)
    return config


LIGHT = ("public.v", "public.tr")


def _light_scenario(db: Any, staging: str, state: Any) -> dict[str, Any]:
    """Three batches of two tables (every type of test_apply_basic; a truncate) for the crash
    tests: a snapshot, updates/deletes/key changes, then a truncate and inserts."""
    _exec(
        db,
        TYPES_DDL,
        "INSERT INTO v VALUES " + ROW % 1,
        "INSERT INTO v VALUES " + ROW % 2,
        'CREATE TABLE tr (id int PRIMARY KEY, "odd name" text)',
        "INSERT INTO tr SELECT g, 'x' FROM generate_series(1, 200) g",
    )
    # truncates captured (Debezium's skipped.operations default, "t", skips them)
    config = pipeline(db, staging, state__store=str(state), skipped__operations="none")
    run_capture(config)
    _exec(
        db,
        "INSERT INTO v VALUES " + ROW % 3,
        "UPDATE v SET txt = 'y', n = 99.99 WHERE id = 1",
        "UPDATE v SET id = 20 WHERE id = 2",
        "UPDATE tr SET \"odd name\" = 'y' WHERE id % 2 = 0",
        "DELETE FROM tr WHERE id > 150",
    )
    run_capture(config)
    _exec(db, "TRUNCATE tr", "INSERT INTO tr VALUES (3, 'after truncate')", "DELETE FROM v WHERE id = 3")
    run_capture(config)
    return config


def assert_silver_matches(
    spark: Any, config: dict[str, Any], target: str, table: str, keys: list[str]
) -> None:
    """Silver equals the live source table, every column (test_apply_basic's check also asks
    the reference applier, which does not follow an added column)."""
    got = silver_rows(spark, target, config, table, keys)
    expected = normalised_rows(source_rows(config, table), semantic_names(config, table))
    assert not (problem := diff(expected, got)), f"silver vs source: {problem}"


def _table_rows(spark: Any, path: str, drop: tuple[str, ...] = ()) -> list[tuple]:
    if not delta_log.table_exists(path):
        return []
    frame = spark.read.format("delta").load(path)
    columns = sorted(c for c in frame.columns if c not in drop)
    return sorted((tuple(repr(r[c]) for c in columns) for r in frame.select(*columns).collect()), key=str)


def _client_commits(path: str) -> int:
    """Commits of the table the client wrote itself (``log_commit``), not the Connect server."""
    fs, local = delta_log.filesystem(path)
    names = [n for n in delta_log._listing(fs, f"{local}/_delta_log") if delta_log._COMMIT.match(n)]
    infos = [
        a["commitInfo"]
        for n in names
        for a in delta_log._actions(fs, f"{local}/_delta_log/{n}")
        if "commitInfo" in a
    ]
    return sum(1 for info in infos if info.get("engineInfo") == "airflow-cdc log_commit")


def _commits(path: str) -> int:
    fs, local = delta_log.filesystem(path)
    return len([n for n in delta_log._listing(fs, f"{local}/_delta_log") if delta_log._COMMIT.match(n)])


@pytest.mark.timeout(1800)
def test_connect_apply_equals_classic_apply(spark, pg_db, connect, tmp_path):
    """On local disk, which the Connect server on this host reads too (the crash tests below run
    on S3): the comparison is of the two engines, not of the stores."""
    config = _scenario(pg_db, str(tmp_path / "staging"), tmp_path / "state")
    batches = [str(b.path) for b in list_batches(config["staging.path"], config["name"])]
    assert len(batches) == 3
    remote, classic = str(tmp_path / "delta-connect"), str(tmp_path / "delta-classic")
    started = time.monotonic()
    _ok(_run_remote(batches[:1], remote, connect.url, catalog="cdc_remote"))
    _ok(_run_remote(batches[1:], remote, connect.url, catalog="cdc_remote"))  # each table's stretch of 2
    seconds = time.monotonic() - started
    settings = ApplySettings(history=HISTORY, catalog="cdc_classic")
    apply_batches(spark, batches[:1], classic, settings)
    apply_batches(spark, batches[1:], classic, settings)
    name = config["name"]
    compared = 0
    for table in TABLES:
        for layer in ("bronze", "silver", "tombstones", "history"):
            # bronze too: both add the staged files (Connect through log_commit), every column
            got = _table_rows(spark, table_path(remote, layer, name, table))
            want = _table_rows(spark, table_path(classic, layer, name, table))
            assert got == want, f"{layer} of {table}: Connect apply differs from the classic one"
            compared += len(got)
    assert compared > 50
    # bronze's files and marks were committed by the client, on every table
    assert all(_client_commits(table_path(remote, "bronze", name, t)) for t in TABLES)
    for table in TABLES:
        assert_silver_matches(spark, config, remote, table, ["id"])
    history = spark.read.format("delta").load(table_path(remote, "history", name, "public.h"))
    assert history.count() > 31  # versions, not just current rows
    # catalog names over the same locations, in the classic session's catalog and the server's
    for layer, table in (("silver", "public.v"), ("bronze", "public.tz"), ("history", "public.h")):
        stored = spark.read.format("delta").load(table_path(classic, layer, name, table)).count()
        assert spark.table(f"cdc_classic.{layer}_{table.replace('.', '_')}").count() == stored
    assert _remote_count(connect.url, "cdc_remote.silver_public_v") == len(
        _table_rows(spark, table_path(remote, "silver", name, "public.v"))
    )
    # a re-run of every batch through Connect writes nothing
    paths = [table_path(remote, layer, name, t) for t in TABLES for layer in ("bronze", "silver", "history")]
    before = {p: _commits(p) for p in paths}
    _ok(_run_remote(batches, remote, connect.url))
    assert {p: _commits(p) for p in paths} == before
    print(f"Connect apply of 3 batches in 2 jobs: {seconds:.1f} s")


def test_client_server_and_store_killed_mid_apply_then_rerun(spark, pg_db, connect, s3, on_s3, tmp_path):
    """Three crashes of one backlog's apply through Connect, then the same job converges: the
    client SIGKILLed between a table's tombstones and its silver MERGE; the Connect server
    SIGKILLed mid-job (the client fails as "server lost", exit 8, retryable); the S3 server
    killed mid-job (exit 7, StorageUnavailable naming the Delta root).  Bronze holds every event
    exactly once afterwards."""
    config = _light_scenario(pg_db, f"{on_s3}/staging", tmp_path / "state")
    staged = list_batches(config["staging.path"], config["name"])
    batches, marks = [str(b.path) for b in staged], [app_id(config["name"], b.batch_id) for b in staged]
    target, name = f"{on_s3}/delta", config["name"]

    def marked(layer: str, mark: str) -> list[str]:
        return [t for t in LIGHT if delta_log.has_applied(table_path(target, layer, name, t), mark)]

    _ok(_run_remote(batches[:1], target, connect.url))
    killed = _run_remote(batches[1:2], target, connect.url, AIRFLOW_CDC_FAILPOINTS="apply_after_tombstones")
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode(errors="replace")[-3000:]
    assert len(marked("silver", marks[1])) < len(LIGHT), "killed too late"

    def interrupted(crash: Any, trigger: Any, retry_seconds: str) -> subprocess.CompletedProcess[bytes]:
        """Run the job of batches 2-3, call ``crash`` once ``trigger`` holds, wait for the job."""
        job = build_apply_job(batches[1:], target, remote=connect.url)
        proc = subprocess.Popen(
            job.command(),
            env={**os.environ, **job.env, "AIRFLOW_CDC_CONNECT_RETRY_SECONDS": retry_seconds},
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and not trigger():
            time.sleep(0.1)
        crash()
        out, err = proc.communicate(timeout=600)
        return subprocess.CompletedProcess(job.command(), proc.returncode, out, err)

    # the server: once the job's session is up and it wrote its first table
    before = set(marked("silver", marks[1]))
    lost = interrupted(connect.kill, lambda: set(marked("silver", marks[1])) - before, "5")
    connect.start()
    assert lost.returncode == EXIT_REMOTE, (lost.stdout + lost.stderr).decode(errors="replace")[-4000:]
    assert isinstance(apply_exit_error(lost.returncode, "b"), ApplyInterrupted)
    # the store: once the last batch reached a bronze table
    try:
        failed = interrupted(s3.stop, lambda: marked("bronze", marks[2]), "20")
    finally:
        s3.start()
    assert failed.returncode == EXIT_STORAGE, (failed.stdout + failed.stderr).decode(errors="replace")[-4000:]
    error = apply_exit_error(failed.returncode, "b", target)
    assert isinstance(error, StorageUnavailable) and target in str(error)
    assert len(marked("silver", marks[2])) < len(LIGHT)
    _ok(_run_remote(batches[1:], target, connect.url))
    _ok(_run_remote(batches, target, connect.url))
    for table in LIGHT:
        assert_silver_matches(spark, config, target, table, ["id"])
    events = sum(
        b.manifest["counts"].get("events", 0) + b.manifest["counts"].get("snapshot_rows", 0) for b in staged
    )
    bronze = sum(
        spark.read.format("delta").load(table_path(target, "bronze", name, t)).count() for t in LIGHT
    )
    assert bronze == events, "bronze lost or repeated events across the kills"
    # on S3 too, the client wrote bronze's commits (conditional puts through core.storage); tr's
    # column "odd name" needs column mapping, so its bronze is re-encoded on the server
    assert _client_commits(table_path(target, "bronze", name, "public.v")) >= 2
    assert not _client_commits(table_path(target, "bronze", name, "public.tr"))


def test_unreachable_server_is_a_retryable_error(pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE u (id int PRIMARY KEY)", "INSERT INTO u VALUES (1)")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    batch = str(list_batches(config["staging.path"], config["name"])[0].path)
    closed = f"sc://127.0.0.1:{_closed_port()}"
    job = build_apply_job(batch, str(tmp_path / "delta"), remote=closed + "/;token=s3cr3t-value")
    assert "s3cr3t-value" not in " ".join(job.command())  # the URL (and token) go by environment
    started = time.monotonic()
    proc = subprocess.run(
        job.command(),
        env={**os.environ, **job.env, "AIRFLOW_CDC_CONNECT_RETRY_SECONDS": "3"},
        capture_output=True,
        timeout=300,
    )
    text = (proc.stdout + proc.stderr).decode(errors="replace")
    assert proc.returncode == EXIT_REMOTE, text[-3000:]
    assert "s3cr3t-value" not in text and "Spark Connect server" in text
    assert time.monotonic() - started < 120
    error = apply_exit_error(proc.returncode, "b1")
    assert isinstance(error, ApplyInterrupted) and "spark.remote" in str(error.hint)


def _remote_count(url: str, table: str) -> int:
    """``count(*)`` of a catalog table, asked of the Connect server by a separate client process
    (a Connect session in this process would turn pyspark's functions remote for the classic one)."""
    code = (
        "import sys; from pyspark.sql import SparkSession; "
        f"print(SparkSession.builder.remote({url!r}).getOrCreate().table({table!r}).count())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.strip().splitlines()[-1])


def test_catalog_name_taken_elsewhere_is_refused(spark, pg_db, tmp_path):
    _exec(pg_db, "CREATE TABLE u (id int PRIMARY KEY)", "INSERT INTO u VALUES (1)")
    config = pipeline(pg_db, tmp_path / "staging")
    run_capture(config)
    batch = str(list_batches(config["staging.path"], config["name"])[0].path)
    other = str(tmp_path / "elsewhere")
    spark.range(1).write.format("delta").save(other)
    spark.sql("CREATE SCHEMA IF NOT EXISTS cdc_taken")
    spark.sql(f"CREATE TABLE cdc_taken.silver_public_u USING delta LOCATION '{other}'")
    with pytest.raises(CatalogError, match="cdc_taken.*silver_public_u.*registered at"):
        apply_batches(spark, [batch], str(tmp_path / "delta"), ApplySettings(catalog="cdc_taken"))
    assert spark.table("cdc_taken.silver_public_u").count() == 1  # not repointed
    with pytest.raises(ConfigError, match="delta.catalog.table.format"):
        ApplyOptions(catalog="x", catalog_format="{layer}_{nope}")


def _closed_port() -> int:
    from airflow_cdc.testing.servers import free_port

    return free_port()


def test_store_stopped_mid_spark_submit_apply_then_converges(spark, pg_db, s3, on_s3, tmp_path):
    """The S3 server killed while a ``spark-submit`` job writes Delta through S3A: exit 7
    (StorageUnavailable naming the Delta root), the last batch not applied, and once the store is
    back the same job converges."""
    config = _light_scenario(pg_db, f"{on_s3}/staging", tmp_path / "state")
    staged = list_batches(config["staging.path"], config["name"])
    batches, target, name = [str(b.path) for b in staged], f"{on_s3}/delta", config["name"]
    retries = {f"spark.hadoop.{k}": v for k, v in s3a_conf(s3).items() if "retry" in k or "attempts" in k}
    job = build_apply_job(batches, target, conf=retries, master="local[1]")
    env = {**os.environ, **job.env}
    proc = subprocess.Popen(
        job.command("local[1]"),
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = app_id(name, staged[0].batch_id)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if any(delta_log.has_applied(table_path(target, "bronze", name, t), first) for t in LIGHT):
            break
        time.sleep(0.1)
    s3.stop()
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        s3.start()
    assert proc.returncode == EXIT_STORAGE, (out + err).decode(errors="replace")[-4000:]
    error = apply_exit_error(proc.returncode, "b", target)
    assert isinstance(error, StorageUnavailable) and target in str(error)
    last = app_id(name, staged[-1].batch_id)
    assert not all(delta_log.has_applied(table_path(target, "silver", name, t), last) for t in LIGHT)
    _ok(
        subprocess.run(
            job.command("local[1]"), env=env, start_new_session=True, capture_output=True, timeout=900
        )
    )
    for table in LIGHT:
        assert_silver_matches(spark, config, target, table, ["id"])
