"""Benchmark: the whole PostgreSQL path at table sizes up to 50M rows (not in ``make test``).

Per size of ``--sizes`` (default 1.5M, 10M, 50M rows, smallest first), in a database of its own on
a PostgreSQL server the bench starts (its data under ``--work``): a table ``items`` with a bigint
key, int, numeric(12,2), text, timestamptz, boolean, jsonb, bytea and a text column ``doc`` that
holds a 3.2 kB value (``STORAGE EXTERNAL``: always TOASTed out of line) on 1 % of the rows, loaded
server-side (``INSERT ... SELECT generate_series``).  Then:

- **snapshot capture**: ``snapshot.mode=initial`` read by fresh ``python -m airflow_cdc.cli capture
  --commit`` processes, ``snapshot.max.rows.per.run`` (``--rows-per-run``, the product's default 1M)
  rows each, ``snapshot.max.threads=--threads``, until the state has no pending snapshot; wall time
  and peak RSS (``wait4``) of every run;
- **snapshot apply**: the staged batches applied to Delta by the apply job (``apply_batches`` in
  groups of ``--batches-per-job``, as ``airflow-cdc apply`` does, in one warm Spark session,
  ``local[2]``, the job's default settings but ``delta.optimize.interval.batches=0``); peak RSS of
  the Spark driver JVM (``VmHWM`` of ``/proc``, reset before each step through ``clear_refs``);
- for the largest size only, a **window** of ``--window`` change events made after the snapshot
  was applied: 60 % updates (keys 1..U, of which the 1 % with a TOASTed ``doc`` keep it unchanged --
  the unchanged-TOAST path -- and 1 % get a new TOASTed ``doc``), 20 % inserts (new keys, 1 % with
  ``doc``) and 20 % deletes, captured by fresh CLI processes (``run.max.events`` per run, the
  default 1M) and applied like the snapshot;
- **compaction**: the job's own ``OPTIMIZE`` (``compaction.compact_if_due``, interval 1) on the
  silver table; live files per silver table before and after;
- **verification**: row count and an aggregate checksum (the sum of the first 32 bits of the MD5
  of each row's values as text, and the sum of ``created`` in epoch seconds) computed by PostgreSQL
  on the source and by Spark on silver, which must be equal (no rows collected);
- the slot and the database are dropped, and the staged and Delta data removed, before the next
  size; everything under ``--work`` the bench made is removed at the end, also on failure.

A size of ``--warmup`` rows (default 100k) runs first, untimed, so that the first timed size does
not pay the JVM's first runs.  Progress (rows, rate, ETA) is logged during the long steps.

Headline rate: the snapshot end to end, ``rows / (capture seconds + apply seconds)`` (capture
timed as the CLI processes' wall time, interpreter start included).  Last line:
``scale: <rows/s at the largest size> rows/s; ratio <largest rate / smallest rate> vs <smallest> rows``.
The target (issue 36): ratio >= 0.85 at 50M against 1.5M, peak capture RSS < 1 GiB.

Quick run: ``--sizes 200000,600000 --window 300000``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import psycopg  # noqa: E402

from bench._common import REPO, TABLE_DDL, dir_size_mib, log, pipeline_config, run_child  # noqa: E402

os.environ.setdefault("AIRFLOW_CDC_DELTA_JARS", str(REPO / ".jars"))

TABLE = "items"
# the other benches' table, plus a bytea and a text column kept out of line (EXTERNAL: TOASTed)
DDL = (
    TABLE_DDL.format(name=TABLE)
    + ";\nALTER TABLE items ADD COLUMN blob bytea, ADD COLUMN doc text;"
    + "\nALTER TABLE items ALTER COLUMN doc SET STORAGE EXTERNAL"
)
# rows lo..hi; 1 % of them (id % 100 = 0) with a 3,200-byte doc, stored out of line (EXTERNAL)
INSERT = """
INSERT INTO items
SELECT g, (g %% 1000)::int, ((g %% 100000) / 100.0)::numeric(12,2),
       'customer-' || lpad(g::text, 10, '0') || '-' || md5(g::text)::varchar(20),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',
       g %% 3 = 0,
       jsonb_build_object('k', g %% 17, 'tag', 't' || (g %% 5), 'ok', g %% 2 = 0),
       decode(md5(g::text), 'hex'),
       CASE WHEN g %% 100 = 0 THEN repeat(md5(g::text), 100) END
FROM generate_series(%s::bigint, %s::bigint) AS g"""
# the window's updates: toasted rows keep their doc (unchanged TOAST), id %% 100 = 50 gets a new one
UPDATE = """
UPDATE items SET qty = qty + 1, price = price + 1, active = NOT active, label = label || '+',
       doc = CASE WHEN id %% 100 = 50 THEN repeat(md5(id::text || 'new'), 100) ELSE doc END
WHERE id BETWEEN %s AND %s"""
DELETE = "DELETE FROM items WHERE id BETWEEN %s AND %s"
# the checksum both sides compute: every value as text (NULLs skipped), MD5, its first 32 bits
PG_CHECK = """
SELECT count(*),
       coalesce(sum(('x' || lpad(substr(md5(concat_ws('|', id::text, qty::text, price::text, label,
           active::text, attrs::text, md5(blob), md5(doc))), 1, 8), 16, '0'))::bit(64)::bigint), 0),
       coalesce(sum(extract(epoch FROM created)::bigint), 0)
FROM items"""
STEP = 1_000_000
PG_SETTINGS = {"max_wal_size": "8GB", "checkpoint_timeout": "30min", "maintenance_work_mem": "512MB"}


@dataclass
class Step:
    """One timed step: rows or events, wall seconds, peak RSS (MiB) and how many runs or jobs."""

    rows: int = 0
    seconds: float = 0.0
    rss_mib: float = 0.0
    runs: int = 0

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class SizeResult:
    size: int
    load_s: float = 0.0
    capture: Step = field(default_factory=Step)
    apply: Step = field(default_factory=Step)
    window_capture: Step | None = None
    window_apply: Step | None = None
    files_before: int = 0
    files_after: int = 0
    compact_s: float = 0.0
    staged_mib: float = 0.0
    lake_mib: float = 0.0
    pg_mib: float = 0.0
    checked: tuple[int, int, int] = (0, 0, 0)

    @property
    def end_to_end(self) -> float:
        return self.size / (self.capture.seconds + self.apply.seconds)


class Progress:
    """Logs done/total, the rate so far and the ETA of a long step."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.started = what, total, time.perf_counter()

    def __call__(self, done: int, note: str = "") -> None:
        took = time.perf_counter() - self.started
        rate = done / took if took else 0.0
        eta = (self.total - done) / rate if rate else 0.0
        log(f"  {self.what}: {done:,}/{self.total:,} ({rate:,.0f}/s, ETA {eta:,.0f}s){note}")


def load(dsn: str, size: int) -> float:
    """Create and fill ``items`` with ``size`` rows, then VACUUM ANALYZE and CHECKPOINT; seconds."""
    started = time.perf_counter()
    progress = Progress("load", size)
    with psycopg.connect(dsn) as conn:
        conn.execute(DDL)
        conn.commit()
        for lo in range(1, size + 1, STEP):
            hi = min(size, lo + STEP - 1)
            conn.execute(INSERT, (lo, hi))
            conn.commit()
            progress(hi)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE items")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def make_window(dsn: str, size: int, events: int) -> tuple[int, int, int]:
    """Change ``events`` rows of a table of ``size`` rows: 60 % updates of keys 1..U, 20 % inserts
    after ``size``, the rest deletes of the keys after U; returns (updates, inserts, deletes)."""
    updates, inserts = int(events * 0.6), int(events * 0.2)
    deletes = events - updates - inserts
    if updates + deletes > size:
        raise SystemExit(f"--window {events:,} needs a table of at least {updates + deletes:,} rows")
    progress = Progress("window DML", events)
    done = 0
    with psycopg.connect(dsn) as conn:
        for sql, lo, hi in ((UPDATE, 1, updates), (INSERT, size + 1, size + inserts),
                            (DELETE, updates + 1, updates + deletes)):
            for start in range(lo, hi + 1, STEP):
                end = min(hi, start + STEP - 1)
                conn.execute(sql, (start, end))
                conn.commit()
                done += end - start + 1
                progress(done)
    return updates, inserts, deletes


def capture_runs(config: dict[str, Any], work: Path, total: int, what: str, key: str) -> Step:
    """Run ``airflow-cdc capture --commit`` in fresh processes until ``key`` (``snapshot_rows`` or
    ``events``) adds up to ``total`` (and, for the snapshot, no snapshot is pending)."""
    path = work / f"{config['name']}.json"
    path.write_text(json.dumps(config))
    args = [sys.executable, "-m", "airflow_cdc.cli", "capture", "--config", str(path), "--commit"]
    step, progress = Step(), Progress(what, total)
    while True:
        run = run_child(args, stderr_path=work / "capture.log")
        if run.code != 0:
            raise RuntimeError(f"capture failed ({run.code}):\n{(work / 'capture.log').read_text()[-3000:]}")
        out = json.loads(run.out)
        step.rows += out[key]
        step.seconds += run.wall
        step.rss_mib = max(step.rss_mib, run.rss_mib)
        step.runs += 1
        progress(step.rows, f"; run {step.runs}: {out[key]:,} in {run.wall:.1f}s, peak RSS {run.rss_mib:,.0f} MiB")
        if step.rows >= total and (key != "snapshot_rows" or not snapshot_pending(config)):
            break
        if step.runs > 10 + 3 * total // 100_000:
            raise RuntimeError(f"{what}: {step.rows:,} of {total:,} after {step.runs} runs")
    if step.rows != total:
        raise RuntimeError(f"{what}: expected {total:,}, captured {step.rows:,}")
    return step


def snapshot_pending(config: dict[str, Any]) -> bool:
    from airflow_cdc.core.pipeline import build_capture

    stored = build_capture(config).store.load(config["name"])
    return bool(((stored.data if stored else {}).get("snapshot") or {}).get("pending"))


class Lake:
    """The warm Spark session and the Delta root the batches are applied to."""

    def __init__(self, spark: Any, root: Path, per_job: int, bronze: bool) -> None:
        from spark_jobs.cdc_apply.job import ApplySettings

        self.spark, self.root, self.per_job = spark, root, per_job
        self.settings = ApplySettings(bronze=bronze, optimize_interval=0)
        self.jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

    def silver(self, connector: str) -> str:
        from spark_jobs.cdc_apply.layout import table_path

        return table_path(str(self.root), "silver", connector, f"public.{TABLE}")

    def _reset_peak(self) -> None:
        Path(f"/proc/{self.jvm_pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS

    def _peak_mib(self) -> float:
        for line in Path(f"/proc/{self.jvm_pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def apply(self, batches: list[Path], rows: int, what: str) -> Step:
        """Apply ``batches`` (oldest first) in groups of ``per_job``; ``rows``: what they hold."""
        from spark_jobs.cdc_apply.job import apply_batches

        step, progress, done = Step(rows=rows), Progress(what, rows), 0
        self._reset_peak()
        for lo in range(0, len(batches), self.per_job):
            group = batches[lo:lo + self.per_job]
            took = time.perf_counter()
            apply_batches(self.spark, [str(b) for b in group], str(self.root), self.settings)
            step.seconds += time.perf_counter() - took
            step.runs += 1
            done += sum(staged_rows(b) for b in group)
            progress(done, f"; {lo + len(group)}/{len(batches)} batches, JVM peak RSS {self._peak_mib():,.0f} MiB")
        step.rss_mib = self._peak_mib()
        return step

    def files(self, connector: str) -> int:
        from spark_jobs.cdc_apply.delta_log import replay

        return len(replay(self.silver(connector)).files)

    def compact(self, connector: str, last: Path) -> float:
        """The job's OPTIMIZE of the silver table (interval 1), marked as ``last``'s; seconds."""
        from spark_jobs.cdc_apply.compaction import compact_if_due
        from spark_jobs.cdc_apply.staged import StagedBatch
        from spark_jobs.cdc_apply.writes import Commit

        staged = StagedBatch(str(last))
        commit = Commit(staged.connector, staged.batch_id, staged.commit_metadata(None, None))
        took = time.perf_counter()
        compact_if_due(self.spark, self.silver(connector), 1, commit)
        return time.perf_counter() - took

    def checksum(self, connector: str) -> tuple[int, int, int]:
        """(rows, MD5 checksum, sum of epoch seconds) of silver, as :data:`PG_CHECK` computes them."""
        from pyspark.sql import functions as F

        df = self.spark.read.format("delta").load(self.silver(connector))
        text = F.concat_ws("|", *(F.col(c).cast("string") for c in ("id", "qty", "price", "label", "active")),
                           F.col("attrs").cast("string"), F.md5("blob"), F.md5("doc"))
        created = F.col("created")
        if dict(df.dtypes)["created"] == "string":
            created = F.to_timestamp(created)
        row = df.agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.conv(F.substring(F.md5(text), 1, 8), 16, 10).cast("bigint")).alias("h"),
            F.sum(created.cast("long")).alias("t"),
        ).collect()[0]
        return int(row["n"]), int(row["h"] or 0), int(row["t"] or 0)


def staged_rows(batch: Path) -> int:
    """Rows (snapshot rows and change events) a staged batch holds, from its manifest."""
    tables = json.loads((batch / "manifest.json").read_text()).get("tables") or {}
    return sum(int(t.get("rows") or 0) for t in tables.values())


def batches_of(staging: Path, connector: str, after: set[str]) -> list[Path]:
    root = staging / connector / "batches"
    return sorted(b for b in root.iterdir() if b.name not in after and (b / "manifest.json").exists())


def run_size(server: Any, lake: Lake, work: Path, size: int, window: int, args: argparse.Namespace) -> SizeResult:
    """Load, snapshot, apply, (window), compact and verify one size; drop its data after."""
    name = f"scale_{size}"
    res = SizeResult(size)
    dsn = server.create_database(name)
    staging = work / "staging"
    config = pipeline_config(server, name, staging, name, f"{name}_slot", f"{name}_pub", **{
        "snapshot.mode": "initial", "snapshot.max.rows.per.run": args.rows_per_run,
        "snapshot.max.threads": args.threads, "run.max.events": args.events_per_run,
        "staging.retention.batches": 1_000_000, "table.include.list": f"public.{TABLE}"})
    try:
        log(f"== {size:,} rows: loading")
        res.load_s = load(dsn, size)
        res.pg_mib = server.execute("SELECT pg_database_size(current_database())", dbname=name)[0][0] / (1 << 20)
        log(f"loaded {size:,} rows in {res.load_s:.1f}s ({size / res.load_s:,.0f} rows/s); database {res.pg_mib:,.0f} MiB")
        res.capture = capture_runs(config, work, size, "snapshot capture", "snapshot_rows")
        batches = batches_of(staging, name, set())
        res.staged_mib = dir_size_mib(staging)
        log(f"snapshot captured: {res.capture.rate:,.0f} rows/s in {res.capture.runs} runs ({res.staged_mib:,.0f} MiB staged)")
        res.apply = lake.apply(batches, size, "snapshot apply")
        log(f"snapshot applied: {res.apply.rate:,.0f} rows/s; end to end {res.end_to_end:,.0f} rows/s")
        last, expected = batches[-1], size
        if window:
            updates, inserts, deletes = make_window(dsn, size, window)
            expected = size + inserts - deletes
            res.window_capture = capture_runs(config, work, window, "window capture", "events")
            fresh = batches_of(staging, name, {b.name for b in batches})
            res.window_apply = lake.apply(fresh, window, "window apply")
            last = fresh[-1]
            log(f"window of {window:,} events: capture {res.window_capture.rate:,.0f} events/s, "
                f"apply {res.window_apply.rate:,.0f} events/s")
        res.files_before = lake.files(name)
        res.compact_s = lake.compact(name, last)
        res.files_after = lake.files(name)
        res.lake_mib = dir_size_mib(lake.root)
        verify(server, lake, name, expected, res)
        return res
    finally:
        server.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                       (config["slot.name"],), dbname=name)
        server.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(lake.root, ignore_errors=True)


def verify(server: Any, lake: Lake, name: str, expected: int, res: SizeResult) -> None:
    """Silver's count and checksum equal the source's; raises ``SystemExit`` when they differ."""
    took = time.perf_counter()
    source = tuple(int(v) for v in server.execute(PG_CHECK, dbname=name)[0])
    silver = lake.checksum(name)
    log(f"verify ({time.perf_counter() - took:.1f}s): source {source}, silver {silver}")
    if source != silver or source[0] != expected:
        raise SystemExit(f"silver != source for {name}: source {source}, silver {silver}, expected {expected:,} rows")
    res.checked = silver


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1500000,10000000,50000000", help="comma-separated table sizes")
    ap.add_argument("--window", type=int, default=10_000_000, help="change events after the largest snapshot")
    ap.add_argument("--warmup", type=int, default=100_000, help="rows of the untimed first size (0: none)")
    ap.add_argument("--rows-per-run", type=int, default=1_000_000, help="snapshot.max.rows.per.run")
    ap.add_argument("--events-per-run", type=int, default=1_000_000, help="run.max.events")
    ap.add_argument("--threads", type=int, default=2, help="snapshot.max.threads")
    ap.add_argument("--batches-per-job", type=int, default=20, help="batches per apply_batches call")
    ap.add_argument("--no-bronze", action="store_true", help="apply silver only")
    ap.add_argument("--work", default=None, help="directory for all data (default: a temp dir)")
    return ap.parse_args()


def report(results: list[SizeResult], window: int) -> None:
    log(f"{'rows':>12} {'load s':>8} {'capture/s':>10} {'runs':>5} {'cap RSS':>8} {'apply/s':>9} "
        f"{'JVM RSS':>8} {'end-to-end/s':>12} {'files':>9} {'staged':>8} {'lake':>8} {'pg':>8}")
    for r in results:
        log(f"{r.size:>12,} {r.load_s:>8.1f} {r.capture.rate:>10,.0f} {r.capture.runs:>5} "
            f"{r.capture.rss_mib:>7,.0f}M {r.apply.rate:>9,.0f} {r.apply.rss_mib:>7,.0f}M {r.end_to_end:>12,.0f} "
            f"{r.files_before:>4}->{r.files_after:<4} {r.staged_mib:>7,.0f}M {r.lake_mib:>7,.0f}M {r.pg_mib:>7,.0f}M")
    last = results[-1]
    if last.window_capture and last.window_apply:
        log(f"window of {window:,} events into {last.size:,} rows: capture {last.window_capture.rate:,.0f} "
            f"events/s ({last.window_capture.runs} runs, peak RSS {last.window_capture.rss_mib:,.0f} MiB), "
            f"apply {last.window_apply.rate:,.0f} events/s (JVM peak RSS {last.window_apply.rss_mib:,.0f} MiB); "
            f"compaction {last.compact_s:.1f}s")
    for r in results:
        log(f"{r.size:>12,} rows, seconds: load {r.load_s:.1f}, capture {r.capture.seconds:.1f}, apply "
            f"{r.apply.seconds:.1f}, compaction {r.compact_s:.1f}" + (
                f", window capture {r.window_capture.seconds:.1f}, window apply {r.window_apply.seconds:.1f}"
                if r.window_capture and r.window_apply else ""))
    captures = [s for r in results for s in (r.capture, r.window_capture) if s]
    applies = [s for r in results for s in (r.apply, r.window_apply) if s]
    log(f"peak RSS: capture {max(s.rss_mib for s in captures):,.0f} MiB (target < 1024), "
        f"apply (Spark driver JVM) {max(s.rss_mib for s in applies):,.0f} MiB; load {os.getloadavg()}")
    first = results[0]
    print(f"scale: {last.end_to_end:.0f} rows/s; ratio {last.end_to_end / first.end_to_end:.2f} vs "
          f"{first.size:,} rows (snapshot capture + apply end to end at {last.size:,} rows)", flush=True)


def main() -> None:
    from airflow_cdc.testing.servers import PostgresServer
    from spark_jobs.cdc_apply import session

    args = parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if args.window - int(args.window * 0.2) > sizes[-1]:  # updates + deletes touch existing keys
        raise SystemExit(f"--window {args.window:,} needs a largest size of at least {args.window * 0.8:,.0f} rows")
    parent = Path(args.work or tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=parent))
    work.chmod(0o755)  # the server's own directory is made inside, owned by its OS user
    tempfile.tempdir = str(work)  # PostgresServer makes its directory with mkdtemp
    log(f"work dir {work}; load {os.getloadavg()}")
    try:
        with PostgresServer(settings=PG_SETTINGS) as server:
            spark = session.build(app_name="bench-scale")
            lake = Lake(spark, work / "lake", args.batches_per_job, not args.no_bronze)
            log(f"Spark local[2], spark.driver.memory={spark.conf.get('spark.driver.memory')} (bounds the "
                "apply's heap)")
            if args.warmup:
                log(f"warm-up: {args.warmup:,} rows (untimed)")
                run_size(server, lake, work, args.warmup, 0, args)
            results = []
            for size in sizes:
                results.append(run_size(server, lake, work, size, args.window if size == sizes[-1] else 0, args))
            spark.stop()
        report(results, args.window)
    finally:
        tempfile.tempdir = None
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
