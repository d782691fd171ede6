"""Benchmark: capture of a Vitess VStream window (inserts + updates on two shards) into staged Parquet
through the VStream *emulator*, against a bare grpcio client draining the same VStream, both measured
in this run.

The emulator serves from its own process, as vtgate would (in-process, its Python threads would
share the GIL with the client being measured).  Measured: ``Capture(VitessSource).run(commit=False)`` from a stored VGTID (the offset does not move,
so every repeat reads the same window).  Baseline: our generated stub's ``VStream`` call from the
same VGTID, iterating the responses and counting row changes until every shard reached the same
target GTID set -- gRPC transfer and protobuf parsing, no decoding.  Both read the emulator's
stream, so the ratio isolates the source's own cost (decode, encode, stage).

Last line: ``vitess_capture: <rows/s> rows/s; ratio <x> vs bare grpcio VStream drain``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REPEATS, clear_batches, fmt, log, median, timed  # noqa: E402

INSERTS, UPDATES = 30_000, 10_000
SCHEMA = [
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, qty INT NOT NULL, price DECIMAL(12,2) NOT NULL,"
    " label VARCHAR(64) NOT NULL, created DATETIME(6) NOT NULL, active TINYINT NOT NULL)"
]


def _bare_drain(address: str, start, target) -> int:
    import grpc

    from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
    from airflow_cdc.sources.vitess.proto import topodata_pb2 as topo
    from airflow_cdc.sources.vitess.proto import vtgate_pb2 as vt
    from airflow_cdc.sources.vitess.proto import vtgateservice_pb2_grpc as svc

    goal = {(g.shard): g.gtid for g in target.shard_gtids}
    channel = grpc.insecure_channel(address)
    request = vt.VStreamRequest(
        tablet_type=topo.PRIMARY, vgtid=start, filter=b.Filter(rules=[b.Rule(match="/.*")])
    )
    call = svc.VitessStub(channel).VStream(request)
    rows, done = 0, set()
    try:
        for response in call:
            for event in response.events:
                if event.type == b.ROW:
                    rows += len(event.row_event.row_changes)
                elif event.type == b.VGTID:
                    done = {g.shard for g in event.vgtid.shard_gtids if goal.get(g.shard) == g.gtid}
            if done == set(goal):
                break
    finally:
        call.cancel()
        channel.close()
    return rows


def _serve(servers, ready, stop) -> None:
    """The emulator in its own process (a vtgate is one too): the GIL is not shared with the client."""
    from airflow_cdc.testing.vitess_emulator import VtgateEmulator

    with VtgateEmulator() as emu:
        emu.add_keyspace("bench", {"-80": servers[0], "80-": servers[1]})
        ready.send(emu.address)
        stop.wait()


def _write(servers) -> None:
    per_txn = 100  # rows per transaction
    for n, server in enumerate(servers):
        base = n * INSERTS // 2
        for lo in range(base + 1, base + INSERTS // 2 + 1, per_txn):
            server.execute(
                "INSERT INTO orders SELECT seq, seq % 1000, (seq % 100000) / 100,"
                " CONCAT('customer-', LPAD(seq, 10, '0')), TIMESTAMP '2024-01-01 00:00:00' + INTERVAL seq SECOND,"
                f" seq % 3 = 0 FROM seq_{lo}_to_{lo + per_txn - 1}",
                database="vt_bench",
            )
        for lo in range(base + 1, base + UPDATES // 2 + 1, per_txn):
            server.execute(
                f"UPDATE orders SET qty = qty + 1 WHERE id BETWEEN {lo} AND {lo + per_txn - 1}",
                database="vt_bench",
            )


def main() -> None:
    import multiprocessing

    from airflow_cdc.testing.vitess_emulator import start_shard_server

    servers = [start_shard_server(), start_shard_server()]
    for server in servers:  # the keyspace's database, created before any gRPC runs here (then fork)
        server.execute("CREATE DATABASE vt_bench CHARACTER SET utf8mb4")
        for ddl in SCHEMA:
            server.execute(ddl, database="vt_bench")
    ctx = multiprocessing.get_context("fork")
    ready, ready_child = ctx.Pipe()
    stop = ctx.Event()
    child = ctx.Process(target=_serve, args=(servers, ready_child, stop), daemon=True)
    child.start()
    try:
        _measure(ready.recv(), servers)
    finally:
        stop.set()
        child.join(10)
        for server in servers:
            server.stop()


def _measure(address: str, servers) -> None:
    from airflow_cdc.core.pipeline import build_capture, build_config, build_store
    from airflow_cdc.sources.vitess.client import VtgateClient
    from airflow_cdc.sources.vitess.offsets import from_offset

    host, port = address.split(":")
    staging = Path(tempfile.mkdtemp(prefix="bench-vitess-"))
    config = build_config({
        "name": "bench", "connector": "vitess", "staging.path": str(staging), "database.hostname": host,
        "database.port": int(port), "vitess.keyspace": "bench", "snapshot.mode": "no_data",
        "vitess.window.idle.timeout": 120,
    })  # fmt: skip
    build_capture(config).run(commit=True)  # stores the VGTID before the writes
    start = from_offset(build_store(config).load("bench").data["offset"])
    log(f"writing {INSERTS:,} inserts and {UPDATES:,} updates")
    _write(servers)
    client = VtgateClient(config)
    target = client.current_vgtid("bench")
    client.close()
    bare = []
    for _ in range(REPEATS):
        seconds, rows = timed(lambda: _bare_drain(address, start, target))
        assert rows == INSERTS + UPDATES, rows
        bare.append(rows / seconds)
    ours = []
    capture = build_capture(config)
    for _ in range(REPEATS):
        clear_batches(staging)
        seconds, result = timed(lambda: capture.run(commit=False))
        assert result.events == INSERTS + UPDATES, result.events
        ours.append(result.events / seconds)
    log(f"bare grpcio VStream drain: {fmt(bare)} rows/s; capture: {fmt(ours)} rows/s")
    print(
        f"vitess_capture: {median(ours):,.0f} rows/s; ratio {median(ours) / median(bare):.2f} "
        f"vs bare grpcio VStream drain ({INSERTS + UPDATES:,} row changes on 2 shards, emulator in its own process)"
    )


if __name__ == "__main__":
    main()
