"""Shared helpers for the PostgreSQL benchmarks: repo path, timing, medians, RSS, profiles, data."""

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
from collections.abc import Callable
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


def run_cli_capture(config: dict[str, Any], workdir: Path, commit: bool = False) -> tuple[float, float, str]:
    """Run ``python -m airflow_cdc.cli capture`` in a fresh subprocess.

    :returns: (wall seconds, child peak RSS MiB from wait4, stdout).
    """
    path = workdir / "pipeline.json"
    path.write_text(json.dumps(config))
    args = [sys.executable, "-m", "airflow_cdc.cli", "capture", "--config", str(path)]
    if commit:
        args.append("--commit")
    env = dict(os.environ, PYTHONPATH=str(REPO) + (os.pathsep + os.environ["PYTHONPATH"]
                                                   if os.environ.get("PYTHONPATH") else ""))
    out_file = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=out_file, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out_file.seek(0)
    out = out_file.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"cli capture failed ({proc.returncode}):\n{out[-3000:]}")
    return wall, usage.ru_maxrss / 1024, out


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
