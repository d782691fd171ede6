"""Benchmark: capture of a 1.5M-event change window, streamed and peeked, vs a bare peek of the slot.

Baselines, on the same window and the same connection (TCP to 127.0.0.1, or the server's Unix
socket with ``--transport unix``): the server-side decode rate (``SELECT count(*)`` of
``pg_logical_slot_peek_binary_changes``: decoding and materialising, nothing sent -- the
physical ceiling of the peek); a bare psycopg fetch of the peek (server-side binary cursor,
fetchmany(4096), counting rows only); two bare ``START_REPLICATION`` streams counting messages
only, stopped when a keepalive reports the target: through psycopg's libpq binding (one
``PQgetCopyData`` call per message from Python) and through the compiled reader
(``_walstream.c``: socket read in large buffers, frames split in C), each with the CPU seconds
the server's walsender spent (``/proc/<pid>/stat``; the server runs on this machine).
Measured: ``build_capture(config).run(commit=False)`` with ``window.reader=stream`` (the
compiled stream reader, and the pure-Python one with ``AIRFLOW_CDC_PG_STREAM=python``) and
``window.reader=peek`` (nothing is consumed, so all repeat on the same window).  Peak RSS of
the capture with the default reader (``peek``) is taken from a fresh ``python -m airflow_cdc.cli
capture`` subprocess; the cProfile run is of the same capture.

Last line (the default window reader, ``window.reader=peek``):
``pg_capture: <events/s> events/s; ratio <bare peek s / capture s> vs bare peek fetch``; the line
before it gives the streaming reader (compiled) the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import struct  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import psycopg  # noqa: E402
import psycopg.conninfo  # noqa: E402
from psycopg import pq  # noqa: E402

from bench._common import (  # noqa: E402
    REPEATS,
    TABLE_DDL,
    clear_batches,
    dir_size_mib,
    fmt,
    insert_range,
    log,
    median,
    pipeline_config,
    profile,
    run_cli_capture,
    self_maxrss_mib,
    timed,
)

INSERTS = 1_000_000
STEP = 250_000
DB, TABLE, SLOT, PUB = "bench_capture", "orders", "bench_slot", "bench_pub"
STREAM_ENV = "AIRFLOW_CDC_PG_STREAM"  # walstream.STREAM_ENV: "python" forces the pure-Python stream reader
CASES = {
    "decode": "server decode (count(*) of the peek; physical ceiling)",
    "peek": "bare peek fetch",
    "stream": "bare START_REPLICATION stream, psycopg/libpq (PQgetCopyData per message)",
    "cstream": "bare START_REPLICATION stream, compiled reader",
    "cap_peek": "capture, window.reader=peek",
    "cap_stream": "capture, window.reader=stream (compiled reader)",
    "cap_pystream": "capture, window.reader=stream (pure-Python reader)",
}
PEEK = ("SELECT {cols} FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s, 'messages', 'true')")


def bare_peek(dsn: str) -> int:
    rows = 0
    with psycopg.connect(dsn) as conn, conn.transaction(), \
            conn.cursor(name="bench_peek", binary=True) as cur:
        cur.execute(PEEK.format(cols="lsn, xid, data"), (SLOT, PUB))
        while True:
            batch = cur.fetchmany(4096)
            if not batch:
                break
            rows += len(batch)
    return rows


def server_decode(dsn: str) -> int:
    """``count(*)`` of the peek: the server decodes and materialises the window, sends one row."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(PEEK.format(cols="count(*)"), (SLOT, PUB)).fetchone()[0]  # type: ignore[index]


#: CPU seconds of the walsender of each bare stream run, by key (see ``walsender_cpu``)
WALSENDER_CPU: dict[str, list[float]] = {"stream": [], "cstream": []}


def walsender_cpu(pid: int) -> float:
    """User + system CPU seconds of server process ``pid`` so far (0.0 if it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_slot_idle(dsn: str) -> None:
    """Wait until the last stream's walsender has let go of the slot (it exits after the close)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(1000):
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
            if row is None or not row[0]:
                return
            time.sleep(0.01)


def _start_command(start: int) -> bytes:
    lsn = f"{start >> 32:X}/{start & 0xFFFFFFFF:X}"
    return (f"START_REPLICATION SLOT {SLOT} LOGICAL {lsn} (proto_version '1', "
            f"publication_names '{PUB}', messages 'true')").encode()


def bare_stream(dsn: str, start: int, upto: int) -> int:
    """Count the window's messages through ``START_REPLICATION`` (no decoding), read as the
    pure-Python streaming reader does: everything buffered, then a 0.1 ms pause when the socket
    is empty."""
    pg = pq.PGconn.connect((dsn + " replication=database").encode())
    try:
        res = pg.exec_(_start_command(start))
        assert res.status == pq.ExecStatus.COPY_BOTH, pg.get_error_message()
        msgs, unpack = 0, struct.Struct(">q").unpack_from
        while True:
            n, buf = pg.get_copy_data(1)
            if n == 0:
                if not select.select([pg.socket], [], [], 0)[0]:
                    time.sleep(0.0001)
                    select.select([pg.socket], [], [], 1.0)
                pg.consume_input()
            elif buf[0] == 0x77:
                msgs += 1
            elif buf[0] == 0x6B and unpack(buf, 1)[0] >= upto:
                WALSENDER_CPU["stream"].append(walsender_cpu(pg.backend_pid))
                return msgs
            elif buf[0] == 0x6B and buf[17]:  # the server asks for a reply (wal_sender_timeout)
                pg.put_copy_data(struct.pack(">cqqqqB", b"r", start, start, start, 0, 0))
                pg.flush()
    finally:
        pg.finish()
        _wait_slot_idle(dsn)


def bare_cstream(dsn: str, start: int, upto: int) -> int:
    """Count the window's messages through the compiled reader (no decoding; batches of 65536)."""
    from airflow_cdc.sources.postgres import _walstream

    pg = pq.PGconn.connect((dsn + " replication=database").encode())
    try:
        reader = _walstream.Reader(pg.socket, start, upto, 1 << 62, 65536)
        reader.start(_start_command(start))
        while reader.next_batch() is not None:
            pass
        WALSENDER_CPU["cstream"].append(walsender_cpu(pg.backend_pid))
        return int(reader.messages)
    finally:
        pg.finish()
        _wait_slot_idle(dsn)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inserts", type=int, default=INSERTS, help="rows inserted (half are then updated)")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="repetitions of baseline and capture")
    ap.add_argument("--no-rss", action="store_true", help="skip the subprocess peak-RSS run")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile run")
    ap.add_argument("--transport", choices=("tcp", "unix"), default="tcp",
                    help="connect over TCP (127.0.0.1) or the server's Unix socket")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    from airflow_cdc.core.pipeline import build_capture
    from airflow_cdc.sources.postgres.columnar import native_available
    from airflow_cdc.testing.servers import PostgresServer

    log(f"pgoutput row decoder: {'compiled (columnar)' if native_available() else 'pure Python'}")

    with PostgresServer() as server, tempfile.TemporaryDirectory(prefix="bench_capture_") as tmp:
        server.start()
        dsn = server.create_database(DB)
        staging = Path(tmp) / "staging"
        config = pipeline_config(server, DB, staging, "bench_capture", SLOT, PUB,
                                 **{"snapshot.mode": "no_data", "run.max.events": 5_000_000})
        if args.transport == "unix":  # libpq takes a directory as host: the server's socket there
            dsn = psycopg.conninfo.make_conninfo(dsn, host=str(server.base_dir))
            config["database.hostname"] = str(server.base_dir)
        with psycopg.connect(dsn) as conn:
            conn.execute(TABLE_DDL.format(name=TABLE))
            conn.commit()
        log("initial capture (creates slot, publication, state)")
        first = build_capture(config).run(commit=True)
        log(f"initial capture committed: {first.events} events, offset {first.to_offset}")

        inserts = args.inserts
        log(f"generating {inserts:,} inserts + {inserts // 2:,} updates")
        with psycopg.connect(dsn) as conn:
            dt, _ = timed(lambda: insert_range(conn, TABLE, 1, inserts, STEP))
            log(f"  inserts: {dt:.1f}s")
            update = f"UPDATE {TABLE} SET qty = qty + 1, active = NOT active WHERE id % 2 = 0"  # noqa: S608
            dt, _ = timed(lambda: (conn.execute(update), conn.commit()))
            log(f"  updates: {dt:.1f}s")
            conn.execute("CHECKPOINT")
        expected = inserts + inserts // 2

        with psycopg.connect(dsn) as conn:
            start, upto = conn.execute(
                "SELECT (confirmed_flush_lsn - '0/0')::int8, (pg_current_wal_flush_lsn() - '0/0')::int8 "
                "FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()  # type: ignore[misc]
        times: dict[str, list[float]] = {k: [] for k in CASES}
        counts: dict[str, int] = {}
        for i in range(args.repeats):
            for key, fn in (("decode", lambda: server_decode(dsn)), ("peek", lambda: bare_peek(dsn)),
                            ("stream", lambda: bare_stream(dsn, start, upto)),
                            ("cstream", lambda: bare_cstream(dsn, start, upto))):
                dt, counts[key] = timed(fn)
                times[key].append(dt)
                cpu = f"; walsender CPU {WALSENDER_CPU[key][-1]:.2f}s" if key in WALSENDER_CPU else ""
                log(f"bare {key} #{i + 1}: {counts[key]:,} rows in {dt:.2f}s = {counts[key] / dt:,.0f} rows/s{cpu}")
            for key, reader, env in (("cap_peek", "peek", ""), ("cap_stream", "stream", ""),
                                     ("cap_pystream", "stream", "python")):
                clear_batches(staging, keep={first.batch_id})
                cfg = dict(config, **{"window.reader": reader})
                os.environ[STREAM_ENV] = env
                try:
                    dt, res = timed(lambda: build_capture(cfg).run(commit=False))  # noqa: B023
                finally:
                    os.environ.pop(STREAM_ENV, None)
                times[key].append(dt)
                counts[key] = res.events
                size = dir_size_mib(Path(res.batch_path))
                log(f"{CASES[key]} #{i + 1}: {res.events:,} events in {dt:.2f}s = "
                    f"{res.events / dt:,.0f} events/s (batch {size:.0f} MiB)")
                if res.events != expected:
                    log(f"  WARNING: expected {expected:,} events, got {res.events:,}")
        clear_batches(staging, keep={first.batch_id})
        report(args, config, Path(tmp), staging, first.batch_id, times, counts)


def report(args: argparse.Namespace, config: dict[str, Any], tmp: Path, staging: Path, first: str,
           times: dict[str, list[float]], counts: dict[str, int]) -> None:
    from airflow_cdc.core.pipeline import build_capture

    child_rss = float("nan")
    if not args.no_rss:
        log("peak RSS: capture (window.reader=peek) in a fresh subprocess (python -m airflow_cdc.cli capture)")
        wall, child_rss, _ = run_cli_capture(dict(config, **{"window.reader": "peek"}), tmp)
        log(f"  subprocess capture: {wall:.2f}s wall (incl. interpreter start), peak RSS {child_rss:,.0f} MiB")
        clear_batches(staging, keep={first})
    if not args.no_profile:
        log("profiling one in-process capture, window.reader=peek (cProfile, tottime)")
        _, prof = profile(lambda: build_capture(dict(config, **{"window.reader": "peek"})).run(commit=False))
        print(prof, flush=True)
        clear_batches(staging, keep={first})
    med = {k: median(v) for k, v in times.items()}
    events = counts["cap_stream"]
    for key, label in CASES.items():
        log(f"{label}: seconds {fmt(times[key], 2)} median {med[key]:.2f}s, {counts[key]:,} rows "
            f"({counts[key] / med[key]:,.0f}/s; {events / med[key]:,.0f} events/s equivalent)")
    for key, cpu in WALSENDER_CPU.items():
        log(f"walsender CPU seconds during the {CASES[key]}: {fmt(cpu, 2)} (median {median(cpu):.2f}s; "
            f"the stream's floor: the server decodes and sends each message with its own send())")
    log(f"transport {args.transport}; ratios vs bare peek fetch (its seconds / theirs): "
        f"capture stream {med['peek'] / med['cap_stream']:.2f} (pure-Python reader "
        f"{med['peek'] / med['cap_pystream']:.2f}), capture peek {med['peek'] / med['cap_peek']:.2f}, "
        f"bare stream libpq {med['peek'] / med['stream']:.2f}, compiled {med['peek'] / med['cstream']:.2f}, "
        f"server decode {med['peek'] / med['decode']:.2f}")
    log(f"server decode rate (the ceiling): {counts['decode'] / med['decode']:,.0f} messages/s")
    log(f"peak RSS: capture subprocess (window.reader=peek) {child_rss:,.0f} MiB (target < 1024); "
        f"this process {self_maxrss_mib():,.0f} MiB (includes in-process repeats)")
    log(f"stream capture (window.reader=stream, compiled reader): {events / med['cap_stream']:.0f} events/s; "
        f"ratio {med['peek'] / med['cap_stream']:.2f} vs bare peek fetch")
    print(f"pg_capture: {counts['cap_peek'] / med['cap_peek']:.0f} events/s; "
          f"ratio {med['peek'] / med['cap_peek']:.2f} vs bare peek fetch", flush=True)


if __name__ == "__main__":
    main()
