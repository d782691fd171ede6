"""Debezium embedded, for ``bench/vs_debezium.py``: fetch, compile, configure and run it.

Two dependency sets (:data:`POSTGRES`, :data:`MARIADB`), each a pom beside this file naming its
Debezium version (``debezium.version``): 3.6.1.Final with the PostgreSQL connector, and 3.5.0.Final
with the MariaDB connector (the newest one the Maven mirror here serves; the MySQL connector of 3.x
refuses MariaDB 10.11).  Each set's jars are fetched and the sink program (``DebeziumBench.java``,
the same source for both) compiled against them once, into the git-ignored
``build/debezium/<name>-<version>/`` (stamped with the hash of their sources, so an edit rebuilds).
Each run is a fresh JVM with the JVM's own defaults (no ``-Xmx``); its peak RSS and CPU seconds come
from ``wait4``, its event rate from the program's own clock, first data event to last.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from bench._common import REPO, log, run_child

HERE = Path(__file__).resolve().parent
MAIN_CLASS = "DebeziumBench"
TOPIC_PREFIX = "bench"
#: What the engine is given beyond the connection and the case: Debezium's defaults otherwise.
SETTINGS_NOTE = (
    "DebeziumEngine.create(Json.class) (the async engine, record.processing.threads = cores), "
    "JsonConverter with schemas enabled, max.batch.size 2048 / max.queue.size 8192 (defaults), "
    "file offset store (and file schema history for MariaDB), JVM defaults (no -Xmx)"
)


class NotServed(RuntimeError):
    """Maven could not resolve a dependency set (a mirror lacking one of its artifacts)."""


@dataclass(frozen=True)
class Build:
    """One Debezium dependency set: ``pom-<name>.xml`` beside this module, the version it names,
    and its cache folder (``jars/`` and ``classes/``)."""

    name: str

    @property
    def pom(self) -> Path:
        return HERE / f"pom-{self.name}.xml"

    @cached_property
    def version(self) -> str:
        found = re.search(r"<debezium\.version>([^<]+)</debezium\.version>", self.pom.read_text())
        if found is None:
            raise RuntimeError(f"{self.pom} names no debezium.version")
        return found.group(1).strip()

    @property
    def cache(self) -> Path:
        return REPO / "build" / "debezium" / f"{self.name}-{self.version}"


POSTGRES = Build("postgres")
MARIADB = Build("mariadb")


@dataclass
class Measured:
    """One side's run of one case, in its own process: the data events, the seconds and CPU
    seconds of the measured phase (Debezium: first to last data event; ours: the capture runs),
    the start-up seconds before it (Debezium: JVM start to the first data event; ours: process
    start to the first run), and for the whole process its wall seconds, CPU seconds (user +
    system), peak RSS and the MiB it wrote (Debezium's JSON lines; our staged Parquet)."""

    events: int
    elapsed_s: float
    cpu_s: float
    startup_s: float
    wall_s: float
    total_cpu_s: float
    rss_mib: float
    out_mib: float

    @property
    def rate(self) -> float:
        return self.events / self.elapsed_s if self.elapsed_s > 0 else float("nan")


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _fetch(build: Build, jars: Path) -> None:
    """Copy the set's runtime jars into ``jars`` (emptied first).

    :raises NotServed: Maven failed; the message's first line names the artifact not found.
    """
    log(f"fetching Debezium {build.version} ({build.name}) jars with Maven into {jars}")
    shutil.rmtree(jars, ignore_errors=True)
    proc = subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(build.pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={jars}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        text = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
        found = re.search(r"(\S+:\S+:\S+) was not found", text)
        first = f"{found.group(1)} was not found" if found else "mvn copy-dependencies failed"
        raise NotServed(f"{first}\n{text[-3000:]}")


def ensure_built(build: Build) -> str:
    """Fetch the set's jars and compile the sink program against them unless the cache has them.

    Repeating is a no-op while the pom and ``DebeziumBench.java`` are unchanged; a failed fetch
    leaves no stamp, so the next call tries again.

    :returns: the classpath.
    :raises NotServed: Maven could not resolve the set.
    :raises RuntimeError: javac failed.
    """
    jars, classes = build.cache / "jars", build.cache / "classes"
    source = HERE / f"{MAIN_CLASS}.java"
    stamp = jars / f".fetched-{_digest(build.pom)}"
    if not stamp.exists():
        _fetch(build, jars)
        stamp.touch()
    built = classes / f".built-{_digest(build.pom, source)}"
    if not built.exists():
        log(f"compiling {source.name} against Debezium {build.version} into {classes}")
        shutil.rmtree(classes, ignore_errors=True)
        classes.mkdir(parents=True)
        proc = subprocess.run(
            ["javac", "-Xlint:all", "-d", str(classes), "-cp", f"{jars}/*", str(source)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"javac failed:\n{proc.stdout}{proc.stderr}")
        built.touch()
    return f"{classes}{os.pathsep}{jars}/*"


def common_props(name: str, workdir: Path) -> dict[str, Any]:
    """Engine properties every case shares: a name, the topic prefix and a file offset store in
    ``workdir`` (kept across the runs of one connector, as a deployed engine keeps it)."""
    return {
        "name": name,
        "topic.prefix": TOPIC_PREFIX,
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(workdir / f"{name}.offsets"),
    }


def postgres_props(
    server: Any, dbname: str, name: str, slot: str, snapshot_mode: str, workdir: Path
) -> dict[str, Any]:
    """The PostgreSQL connector over pgoutput, on slot ``slot`` (created by the connector) and
    the publication it creates for all tables (``dbz_publication``, its default)."""
    return {
        **common_props(name, workdir),
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "database.hostname": server.host,
        "database.port": server.port,
        "database.user": server.superuser,
        "database.password": server.password,
        "database.dbname": dbname,
        "slot.name": slot,
        "table.include.list": "public.orders",
        "snapshot.mode": snapshot_mode,
    }


def mariadb_props(
    server: Any, database: str, name: str, server_id: int, snapshot_mode: str, workdir: Path
) -> dict[str, Any]:
    """Debezium's MariaDB connector (:data:`MARIADB`'s set), its schema history in a file beside
    the offsets; ``server_id`` is its replica id, unique among the server's binlog readers."""
    return {
        **common_props(name, workdir),
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "database.hostname": server.host,
        "database.port": server.port,
        "database.user": "root",
        "database.password": server.password,
        "database.server.id": server_id,
        "database.include.list": database,
        "table.include.list": f"{database}.orders",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(workdir / f"{name}.history"),
        "snapshot.mode": snapshot_mode,
    }


def _properties_text(props: dict[str, Any]) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")

    return "".join(f"{k}={esc(v)}\n" for k, v in props.items())


def run_engine(
    classpath: str,
    props: dict[str, Any],
    topic: str,
    events: int,
    workdir: Path,
    *,
    idle_s: int = 120,
    jvm_opts: tuple[str, ...] = (),
) -> Measured:
    """Run the engine in a fresh JVM until ``events`` data events reached ``topic`` (0: until its
    streaming phase is connected, leaving its slot or offsets behind for the next run).

    :raises RuntimeError: the program failed, stopped early or went ``idle_s`` seconds without a
        data event (with the tail of its log, ``<workdir>/<name>.log``).
    """
    name = props["name"]
    prop_file, out_file = workdir / f"{name}.properties", workdir / f"{name}.jsonl"
    prop_file.write_text(_properties_text(props))
    log_file = workdir / f"{name}.{events}.log"
    args = [
        "java",
        *jvm_opts,
        "-cp",
        classpath,
        MAIN_CLASS,
        str(prop_file),
        str(out_file),
        topic,
        str(events),
        str(idle_s),
    ]
    run = run_child(args, env=dict(os.environ), stderr_path=log_file)
    lines = [ln for ln in run.out.splitlines() if ln.startswith("RESULT ")]
    if run.code != 0 or not lines:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"Debezium run {name} failed ({run.code}): {run.out[-2000:]}\nlog tail:\n{tail}")
    res = json.loads(lines[-1][len("RESULT ") :])
    if events and (res["events"] != events or res["extra"]):
        raise RuntimeError(
            f"Debezium run {name}: {res['events']} + {res['extra']} data events, expected {events}"
        )
    startup = res["jvm_to_main_s"] + max(res["main_to_first_s"], 0.0)
    out_mib = out_file.stat().st_size / (1 << 20) if out_file.exists() else 0.0
    return Measured(
        res["events"], res["elapsed_s"], res["cpu_s"], startup, run.wall, run.cpu_s, run.rss_mib, out_mib
    )
