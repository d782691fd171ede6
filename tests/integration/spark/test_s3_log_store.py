"""Delta commits on S3 are put-if-absent: our LogStore (``io.airflowcdc.delta.S3ConditionalLogStore``,
scripts/logstore/, configured by ``layout.S3_LOG_STORE_CONF``) against a real S3 server (s3proxy).

(a) The store itself, through py4j: a commit file is written with ``If-None-Match: *``, a second
    write of the same version raises ``java.nio.file.FileAlreadyExistsException``; a filesystem
    without conditional writes gets an error naming the setting.
(b) Two Spark drivers (two processes, a JVM each, ``local[1]``) append to and MERGE into one
    Delta table on ``s3a://`` at the same moments, round after round, so that in every round both
    attempt the same version: the table ends with every row of both, and the Delta log holds every
    commit of both, versions 0..N without a gap.  With Delta's default ``S3SingleDriverLogStore``
    (a HEAD, then an unconditional PUT) the same race overwrites a commit now and then: both
    drivers "succeed" and the rows of one are gone.

This module is also the writer: ``python -m tests.integration.spark.test_s3_log_store writer ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.storage.settings import StorageSettings
from airflow_cdc.testing.s3proxy import REGION, S3ProxyServer, s3proxy_jar
from spark_jobs.cdc_apply.layout import JARS_ENV, S3_LOG_STORE_CONF

pytestmark = [pytest.mark.spark]

REPO = Path(__file__).resolve().parents[3]
STARTED = time.monotonic()
LOG_STORE = "io.airflowcdc.delta.S3ConditionalLogStore"
LOG_STORE_JAR = "airflow-cdc-logstore.jar"
WRITERS = ("a", "b")
ROUNDS = 6  # per writer: appends on even rounds, MERGEs on odd ones
APPEND_ROWS = 3


def _jar_folder() -> Path:
    return Path(os.environ.get(JARS_ENV) or REPO / ".jars")


@pytest.fixture(scope="module")
def s3_server():
    if s3proxy_jar() is None:
        pytest.skip("s3proxy jar or java missing: run `make setup`")
    if not (_jar_folder() / LOG_STORE_JAR).is_file():
        pytest.skip(f"{LOG_STORE_JAR} missing from {_jar_folder()}: run `make setup` (target logstore)")
    with S3ProxyServer() as server:
        yield server


def _s3a(server: S3ProxyServer) -> dict[str, str]:
    """Hadoop S3A keys for ``server``, credentials included (test only)."""
    return {
        "fs.s3a.endpoint": server.endpoint,
        "fs.s3a.endpoint.region": REGION,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": server.access_key,
        "fs.s3a.secret.key": server.secret_key,
    }


def _hadoop_conf(spark: Any, server: S3ProxyServer, **extra: str) -> Any:
    """A copy of the session's Hadoop configuration pointed at ``server`` (the session's stays as is)."""
    jvm = spark.sparkContext._jvm
    conf = jvm.org.apache.hadoop.conf.Configuration(spark.sparkContext._jsc.hadoopConfiguration())
    for key, value in {**_s3a(server), **extra}.items():
        conf.set(key, value)
    return conf


def _lines(spark: Any, *lines: str) -> Any:
    out = spark.sparkContext._jvm.java.util.ArrayList()
    for line in lines:
        out.add(line)
    return out.iterator()


def _java_class(error: BaseException) -> str:
    java = getattr(error, "java_exception", None)
    return java.getClass().getName() if java is not None else type(error).__name__


# -- (a) the store on its own ----------------------------------------------------------------------
def test_commit_file_is_put_if_absent(spark, s3_server):
    from py4j.protocol import Py4JJavaError

    jvm = spark.sparkContext._jvm
    conf = _hadoop_conf(spark, s3_server)
    store = getattr(jvm, LOG_STORE)(conf)
    bucket = s3_server.make_bucket()
    commit = jvm.org.apache.hadoop.fs.Path(f"s3a://{bucket}/t/_delta_log/{0:020d}.json")
    store.write(commit, _lines(spark, '{"first":1}', '{"first":2}'), False, conf)
    with pytest.raises(Py4JJavaError) as lost:
        store.write(commit, _lines(spark, '{"second":1}'), False, conf)
    assert _java_class(lost.value) == "java.nio.file.FileAlreadyExistsException"
    # refused by S3 itself (412 Precondition Failed, S3A's RemoteFileChangedException), not by a HEAD
    assert (
        lost.value.java_exception.getCause().getClass().getName()
        == "org.apache.hadoop.fs.s3a.RemoteFileChangedException"
    )
    assert list(store.read(commit, conf)) == ['{"first":1}', '{"first":2}']  # the loser wrote nothing

    # overwrite=True (Delta's _last_checkpoint) replaces the object
    last = jvm.org.apache.hadoop.fs.Path(f"s3a://{bucket}/t/_delta_log/_last_checkpoint")
    store.write(last, _lines(spark, "old"), True, conf)
    store.write(last, _lines(spark, "new"), True, conf)
    assert list(store.read(last, conf)) == ["new"]
    listed = [s.getPath().getName() for s in store.listFrom(commit, conf)]
    assert listed == [f"{0:020d}.json", "_last_checkpoint"]  # the probe object is gone again

    # a write that fails part-way (here the iterator throws) publishes nothing: aborted, not closed
    items = jvm.java.util.ArrayList()
    items.add('{"x":1}')
    broken = items.iterator()
    items.add('{"y":2}')  # the iterator's next() now throws ConcurrentModificationException
    failed = jvm.org.apache.hadoop.fs.Path(f"s3a://{bucket}/t/_delta_log/{2:020d}.json")
    with pytest.raises(Py4JJavaError) as broke:
        store.write(failed, broken, False, conf)
    assert _java_class(broke.value) == "java.util.ConcurrentModificationException"
    assert not commit.getFileSystem(conf).exists(failed)

    # why a LogStore of our own: S3A's plain create(path, overwrite=false), which Delta's
    # S3SingleDriverLogStore calls, probes with HEAD when the stream opens and PUTs unconditionally
    # when it closes, so of two writers that both opened the stream the second overwrites the first
    fs = commit.getFileSystem(conf)
    plain = jvm.org.apache.hadoop.fs.Path(f"s3a://{bucket}/t/_delta_log/{1:020d}.json")
    first, second = fs.create(plain, False), fs.create(plain, False)
    first.write(b"first")
    first.close()
    second.write(b"second")
    second.close()
    assert list(store.read(plain, conf)) == ["second"]
    fs.delete(plain, False)

    # S3A with conditional writes switched off: a clear error, nothing written
    off = _hadoop_conf(spark, s3_server, **{"fs.s3a.create.conditional.enabled": "false"})
    other = s3_server.make_bucket()  # another bucket: its own S3AFileSystem with this setting
    with pytest.raises(Py4JJavaError) as refused:
        store.write(
            jvm.org.apache.hadoop.fs.Path(f"s3a://{other}/t/_delta_log/{0:020d}.json"),
            _lines(spark, "{}"),
            False,
            off,
        )
    message = str(refused.value.java_exception.getMessage())
    assert "fs.s3a.create.conditional.enabled" in message and "spark.delta.logStore.s3a.impl" in message


# -- (b) two drivers racing for the same versions ---------------------------------------------------
def race(
    server: S3ProxyServer, tmp: Path, rounds: int = ROUNDS, ours: bool = True, timeout: float = 400
) -> dict[str, Any]:
    """Two writers race on a new table; returns their reports, the table's rows (read by writer
    ``a`` once both are done) and every commit's ``userMetadata`` by version (read with pyarrow)."""
    bucket = server.make_bucket()
    barrier = tmp / f"barrier-{uuid.uuid4().hex[:6]}"
    barrier.mkdir()
    env = {**os.environ, **server.env(), JARS_ENV: str(_jar_folder()), "TZ": "UTC"}
    args = ["--table", f"s3a://{bucket}/race", "--rounds", str(rounds), "--barrier", str(barrier)]
    if not ours:
        args.append("--default-log-store")
    began = time.monotonic()
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "tests.integration.spark.test_s3_log_store", "writer", "--name", name, *args],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=open(tmp / f"writer-{name}.log", "wb"),  # noqa: SIM115
        )
        for name in WRITERS
    }  # fmt: skip
    try:
        outs = {
            n: p.communicate(timeout=max(1.0, timeout - (time.monotonic() - began)))[0]
            for n, p in procs.items()
        }
    finally:
        for p in procs.values():  # one left waiting at the barrier when the other failed
            if p.poll() is None:
                p.kill()
                p.wait()
    seconds = time.monotonic() - began
    for name, proc in procs.items():
        if proc.returncode != 0:
            tail = (tmp / f"writer-{name}.log").read_text(errors="replace")[-4000:]
            raise AssertionError(f"writer {name} exited {proc.returncode}:\n{tail}")
    reports = {n: json.loads(out.decode().strip().splitlines()[-1]) for n, out in outs.items()}
    rows = {(w, i): (kind, n) for w, i, kind, n in reports["a"].pop("rows")}
    commits = _commits(server, bucket, "race/_delta_log")
    return {"reports": list(reports.values()), "rows": rows, "commits": commits, "seconds": seconds}


def _commits(server: S3ProxyServer, bucket: str, log: str) -> dict[int, str | None]:
    """Version -> commitInfo.userMetadata of every commit file, read with pyarrow (not Delta)."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=server.access_key, secret_key=server.secret_key, region=REGION,
        endpoint_override=server.endpoint.removeprefix("http://"), scheme="http",
    )  # fmt: skip
    out: dict[int, str | None] = {}
    for info in fs.get_file_info(pafs.FileSelector(f"{bucket}/{log}")):
        name = info.base_name
        if name.endswith(".json") and name[:-5].isdigit():
            with fs.open_input_stream(info.path) as f:
                actions = [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]
            meta = next((a["commitInfo"].get("userMetadata") for a in actions if "commitInfo" in a), None)
            out[int(name[:-5])] = meta
    return out


def expected_rows(rounds: int) -> dict[tuple[str, int], tuple[str, int]]:
    rows: dict[tuple[str, int], tuple[str, int]] = {}
    for w in WRITERS:
        rows[(w, -1)] = ("counter", rounds // 2)  # +1 by each MERGE
        for i in range(rounds):
            if i % 2 == 0:
                rows.update({(w, i * 100 + k): ("append", 0) for k in range(APPEND_ROWS)})
            else:
                rows[(w, i * 100)] = ("merge", 0)
    return rows


def test_two_drivers_lose_no_commit(s3_server, tmp_path):
    out = race(s3_server, tmp_path)
    print(json.dumps(out["reports"]), f"race: {out['seconds']:.0f} s")  # shown when it fails
    commits = out["commits"]
    assert sorted(commits) == list(range(1 + len(WRITERS) * ROUNDS)), "versions 0..N, no gap"
    assert sorted(m for m in commits.values() if m) == sorted(
        f"{w}:{i}" for w in WRITERS for i in range(ROUNDS)
    )
    assert out["rows"] == expected_rows(ROUNDS)
    # the drivers did race for the same versions: losers got FileAlreadyExistsException and retried
    assert sum(r["conflicts"] for r in out["reports"]) > 0, out["reports"]


# -- the writer process -----------------------------------------------------------------------------
def _wait_for(path: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after {timeout} s: the other writer is gone")
        time.sleep(0.002)


def _is_conflict(error: BaseException) -> bool:
    """A Delta concurrent-modification error (a logical conflict: the application may retry)."""
    return "Concurrent" in type(error).__name__ or "ConcurrentModification" in str(error)[:2000]


def _statement(me: str, table: str, i: int) -> str:
    """Round ``i``: an append (even rounds) or a MERGE that counts and inserts (odd), in ``me``'s
    partition: the two writers' commits never conflict logically, only race for versions."""
    if i % 2 == 0:
        values = ", ".join(f"('{me}', {i * 100 + k}, 'append', 0)" for k in range(APPEND_ROWS))
        return f"INSERT INTO {table} VALUES {values}"
    return (
        f"MERGE INTO {table} t USING (SELECT * FROM VALUES ('{me}', -1, 'counter', 1),"
        f" ('{me}', {i * 100}, 'merge', 0) AS v(writer, id, kind, n)) s"
        f" ON t.writer = '{me}' AND t.writer = s.writer AND t.id = s.id"
        " WHEN MATCHED THEN UPDATE SET t.n = t.n + s.n WHEN NOT MATCHED THEN INSERT *"
    )


def writer(args: argparse.Namespace) -> dict[str, Any]:
    """Race the other writer for ``args.rounds`` commits (SQL only: no Python worker processes).
    Writer ``a`` creates the table first and, once both are done, reads it back."""
    from spark_jobs.cdc_apply import session

    conf = {
        **StorageSettings.from_env().hadoop_conf(),  # endpoint; credentials: S3A reads AWS_* itself
        "spark.driver.memory": "1g",
        # C1 only and one GC thread: half the CPU of a short local[1] driver (startup is most of it)
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.sql.shuffle.partitions": "1",
        "spark.databricks.delta.merge.materializeSource": "none",
    }
    if not args.default_log_store:
        conf |= S3_LOG_STORE_CONF
    spark = session.build(master="local[1]", app_name=f"log-store-race-{args.name}", **conf)
    me, table = args.name, f"delta.`{args.table}`"
    other = next(w for w in WRITERS if w != me)
    barrier = Path(args.barrier)
    if me == "a":
        counters = ", ".join(f"('{w}', -1, 'counter', 0)" for w in WRITERS)
        spark.sql(
            f"CREATE TABLE {table} USING delta PARTITIONED BY (writer)"
            " TBLPROPERTIES ('delta.checkpointInterval' = '1000')"  # no checkpoint mid-race: less work
            f" AS SELECT * FROM VALUES {counters} AS v(writer, id, kind, n)"
        )
        (barrier / "created").touch()
    else:
        _wait_for(barrier / "created")
    spark.sql(f"SELECT count(*) FROM {table}").collect()  # Delta loaded, the table read: ready to race
    started = round(time.monotonic() - STARTED, 1)
    retries, rounds = 0, []
    for i in range(args.rounds):
        (barrier / f"{me}-{i}").touch()
        _wait_for(barrier / f"{other}-{i}")  # both start round i together: they race for a version
        began = time.monotonic()
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", f"{me}:{i}")
        for attempt in range(20):
            try:
                spark.sql(_statement(me, table, i)).collect()
                break
            except Exception as e:  # noqa: BLE001 - only Delta's conflicts are retried
                if not _is_conflict(e) or attempt == 19:
                    raise
                retries += 1
        rounds.append(round(time.monotonic() - began, 2))
        print(f"{me}:{i} {rounds[-1]} s", file=sys.stderr, flush=True)
    (barrier / f"{me}-done").touch()
    report: dict[str, Any] = {"name": me, "app_retries": retries, "rounds": rounds, "startup_s": started}
    if me == "a":
        _wait_for(barrier / f"{other}-done")
        report["rows"] = [list(r) for r in spark.sql(f"SELECT writer, id, kind, n FROM {table}").collect()]
    jvm = spark.sparkContext._jvm
    report["conflicts"] = 0 if args.default_log_store else int(getattr(jvm, LOG_STORE).conflicts())
    report["jvm_cpu_s"] = _cpu_seconds(spark.sparkContext._gateway.proc.pid)
    spark.stop()
    return report


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux): comparable on a loaded machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 1)
    except (OSError, IndexError, ValueError):
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="test_s3_log_store")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writer", help="one racing Spark driver (test_two_drivers_lose_no_commit)")
    w.add_argument("--name", required=True, choices=WRITERS)
    w.add_argument("--table", required=True)
    w.add_argument("--rounds", type=int, default=ROUNDS)
    w.add_argument("--barrier", required=True, help="a directory both writers see")
    w.add_argument("--default-log-store", action="store_true", help="Delta's S3SingleDriverLogStore")
    args = parser.parse_args(argv)
    print(json.dumps(writer(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
