"""Shared helpers for the benchmarks: repo path, timing, medians, RSS, child processes, profiles, data."""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

REPEATS = 3

# A realistic mix of columns: bigint PK, int, numeric(12,2), ~40-char text, timestamptz, boolean, small jsonb.
TABLE_DDL = """
CREATE TABLE {name} (
    id      bigint PRIMARY KEY,
    qty     integer NOT NULL,
    price   numeric(12,2) NOT NULL,
    label   text NOT NULL,
    created timestamptz NOT NULL,
    active  boolean NOT NULL,
    attrs   jsonb
)"""

# Rows ids lo..hi (inclusive) with the mix of column values above.
INSERT_SQL = """
INSERT INTO {name} (id, qty, price, label, created, active, attrs)
SELECT g, (g %% 1000)::int, ((g %% 100000) / 100.0)::numeric(12,2),
       'customer-' || lpad(g::text, 10, '0') || '-' || md5(g::text)::varchar(20),
       timestamptz '2024-01-01 00:00:00+00' + (g || ' seconds')::interval,
       g %% 3 = 0,
       jsonb_build_object('k', g %% 17, 'tag', 't' || (g %% 5), 'ok', g %% 2 = 0)
FROM generate_series(%s::bigint, %s::bigint) AS g"""

# The same mix for MariaDB (bench/mysql_*.py, vs_debezium.py): ``INSERT`` of ids lo..hi from
# MariaDB's sequence engine, formatted with ``lo`` and ``hi``.
MYSQL_DDL = """CREATE TABLE orders (id bigint PRIMARY KEY, qty int NOT NULL, price decimal(12,2) NOT NULL,
    label varchar(64) NOT NULL, created datetime(6) NOT NULL, active tinyint(1) NOT NULL, attrs json)"""
MYSQL_INSERT = """INSERT INTO orders SELECT seq, seq % 1000, (seq % 100000) / 100,
    concat('customer-', lpad(seq, 10, '0'), '-', left(md5(seq), 20)), '2024-01-01' + INTERVAL seq SECOND,
    seq % 3 = 0, json_object('k', seq % 17, 'tag', concat('t', seq % 5), 'ok', seq % 2 = 0)
    FROM seq_{lo}_to_{hi}"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values)


def fmt(values: list[float], digits: int = 0) -> str:
    return "[" + ", ".join(f"{v:,.{digits}f}" for v in values) + "]"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def self_maxrss_mib() -> float:
    """Peak RSS of this process (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def children_maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def populate(conn: Any, name: str, rows: int, step: int = 250_000) -> None:
    """Create table ``name`` and fill it with ``rows`` rows in transactions of ``step`` rows."""
    conn.execute(TABLE_DDL.format(name=name))
    conn.commit()
    insert_range(conn, name, 1, rows, step)


def insert_range(conn: Any, name: str, lo: int, hi: int, step: int = 250_000) -> None:
    for start in range(lo, hi + 1, step):
        conn.execute(INSERT_SQL.format(name=name), (start, min(hi, start + step - 1)))
        conn.commit()


def pipeline_config(server: Any, dbname: str, staging: Path, name: str, slot: str, pub: str,
                    **props: Any) -> dict[str, Any]:
    """A pipeline config in the shape of ``tests/integration/postgres/support.pipeline``."""
    base = {"name": name, "connector": "postgresql", "database.hostname": server.host,
            "database.port": server.port, "database.user": server.superuser,
            "database.password": server.password, "database.dbname": dbname,
            "staging.path": str(staging), "slot.name": slot, "publication.name": pub}
    base.update(props)
    return base


@dataclass
class ChildRun:
    """One finished child process: its exit code, wall seconds (from spawn to reaped), peak RSS
    (MiB, the kernel's high-water mark from ``wait4``), CPU seconds (user + system of all its
    threads and of the children it reaped) and its stdout (with stderr unless sent elsewhere)."""

    code: int
    wall: float
    rss_mib: float
    cpu_s: float
    out: str


def run_child(
    args: Sequence[str], *, env: dict[str, str] | None = None, stderr_path: Path | None = None
) -> ChildRun:
    """Run ``args`` from the repo root and measure it with ``wait4``; a non-zero exit is returned,
    not raised.

    :param env: the environment (default: this process's, with the repo on ``PYTHONPATH``).
    :param stderr_path: a file for the child's stderr (default: mixed into ``out``).
    """
    if env is None:
        extra = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=str(REPO) + (os.pathsep + extra if extra else ""))
    out_file = tempfile.TemporaryFile()
    err = open(stderr_path, "wb") if stderr_path else None
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(args), stdout=out_file, stderr=err or subprocess.STDOUT, env=env,
                                cwd=str(REPO))
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    finally:
        if err:
            err.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    out_file.seek(0)
    return ChildRun(proc.returncode, wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime,
                    out_file.read().decode(errors="replace"))


def run_cli_capture(config: dict[str, Any], workdir: Path, commit: bool = False) -> tuple[float, float, str]:
    """Run ``python -m airflow_cdc.cli capture`` in a fresh subprocess.

    :returns: (wall seconds, child peak RSS MiB from wait4, stdout).
    """
    path = workdir / "pipeline.json"
    path.write_text(json.dumps(config))
    args = [sys.executable, "-m", "airflow_cdc.cli", "capture", "--config", str(path)]
    if commit:
        args.append("--commit")
    run = run_child(args)
    if run.code != 0:
        raise RuntimeError(f"cli capture failed ({run.code}):\n{run.out[-3000:]}")
    return run.wall, run.rss_mib, run.out


def profile(fn: Callable[[], Any], top: int = 15) -> tuple[Any, str]:
    """Run ``fn`` under cProfile; return its result and the top lines sorted by tottime."""
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    text = buf.getvalue()
    # keep the table only (drop the preamble up to the header line)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("ncalls"):
            lines = lines[i - 1:]
            break
    return result, "\n".join(line for line in lines if line.strip())


def clear_batches(staging: Path, keep: set[str] | None = None) -> None:
    """Delete batch directories under ``staging`` (all, or all but the names in ``keep``)."""
    for conn_dir in staging.iterdir() if staging.exists() else []:
        root = conn_dir / "batches"
        if not root.is_dir():
            continue
        for b in root.iterdir():
            if keep and b.name in keep:
                continue
            shutil.rmtree(b, ignore_errors=True)


def dir_size_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / (1 << 20)
