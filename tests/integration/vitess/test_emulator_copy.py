"""The emulator's copy phase: tables in primary key order in chunks, LASTPK progress in the VGTID's
``table_p_ks``, COPY_COMPLETED, and a copy resumed from a VGTID in a second stream with writes in
between converges on the table exactly."""

from __future__ import annotations

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from tests.integration.vitess.support import Drain, kinds, request, rows_of, transactions

SCHEMA = [
    "CREATE TABLE t1 (id INT PRIMARY KEY, v VARCHAR(10))",
    "CREATE TABLE t2 (a VARCHAR(8), b INT, note TEXT, PRIMARY KEY (a, b))",
]


def apply(model: dict, events: list[b.VEvent], width: int = 1) -> None:
    """Apply ROW changes to ``model`` (``table -> key -> row``); a key is the first ``width`` values."""
    for e in events:
        if e.type != b.ROW:
            continue
        table = model.setdefault(e.row_event.table_name, {})
        for before, after in rows_of([e]):
            if before is not None:
                table.pop(tuple(before[:width]), None)
            if after is not None:
                table[tuple(after[:width])] = after


def rows_in(vtgate, keyspace: str, table: str, width: int) -> dict:
    shard = vtgate.route(keyspace)
    conn = shard.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")  # noqa: S608
            return {tuple(r[:width]): list(r) for r in cur.fetchall()}
    finally:
        conn.close()


def test_copy_in_chunks_then_stream(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, SCHEMA)
    for i in range(10):
        vtgate.execute(keyspace, "INSERT INTO t1 VALUES (%s, %s)", (i, f"v{i}"))
    vtgate.execute(keyspace, "INSERT INTO t2 VALUES ('b', 2, 'x'), ('a', 10, NULL), ('a', 9, 'y')")
    with Drain(vtgate.address, request(keyspace, gtid="")) as drain:
        events = drain.until(lambda ev: any(e.type == b.COPY_COMPLETED and not e.keyspace for e in ev))
        vtgate.execute(keyspace, "UPDATE t1 SET v = 'new' WHERE id = 3")
        later = drain.until(lambda ev: len(rows_of(ev)) >= 14)
    copied = rows_of(events)
    assert [after[0] for _, after in copied[:10]] == [str(i).encode() for i in range(10)]
    assert [after[:2] for _, after in copied[10:]] == [[b"a", b"9"], [b"a", b"10"], [b"b", b"2"]]
    chunks = [t for t in transactions(events) if any(e.type == b.ROW for e in t)]
    assert [len(rows_of(t)) for t in chunks] == [4, 4, 2, 3]
    progress = [t[-2].vgtid.shard_gtids[0] for t in chunks]
    assert [[pk.table_name for pk in g.table_p_ks] for g in progress] == [["t1"], ["t1"], ["t1"], ["t2"]]
    assert progress[1].table_p_ks[0].lastpk.rows[0].values == b"7"
    assert [f.name for f in progress[3].table_p_ks[0].lastpk.fields] == ["a", "b"]
    tail = kinds(events)[-3:]
    assert tail == ["COMMIT", "COPY_COMPLETED", "COPY_COMPLETED"]
    done = [e for e in events if e.type == b.VGTID][-1].vgtid.shard_gtids[0]
    assert not done.table_p_ks and done.gtid.startswith("MySQL56/")
    assert rows_of(later)[-1] == ([b"3", b"v3"], [b"3", b"new"])


def test_copy_resumes_from_table_p_ks_in_a_second_stream(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, SCHEMA)
    for i in range(10):
        vtgate.execute(keyspace, "INSERT INTO t1 VALUES (%s, %s)", (i, f"v{i}"))
    vtgate.execute(keyspace, "INSERT INTO t2 VALUES ('a', 1, 'x'), ('c', 3, 'z')")
    with Drain(vtgate.address, request(keyspace, gtid="")) as first:
        events = first.until(lambda ev: len([t for t in transactions(ev) if rows_of(t)]) >= 1)
    # keep what a client would have committed when it stopped after the first chunk
    first_chunk = next(i for i, t in enumerate(transactions(events)) if rows_of(t))
    committed = [e for t in transactions(events)[: first_chunk + 1] for e in t]
    vgtid = [e for e in committed if e.type == b.VGTID][-1].vgtid
    assert vgtid.shard_gtids[0].table_p_ks[0].lastpk.rows[0].values == b"3"
    # writes while no stream runs: below and above the copied key, in a table not started yet
    vtgate.execute(keyspace, "UPDATE t1 SET v = 'below' WHERE id = 1")
    vtgate.execute(keyspace, "DELETE FROM t1 WHERE id = 2")
    vtgate.execute(keyspace, "UPDATE t1 SET v = 'above' WHERE id = 8")
    vtgate.execute(keyspace, "INSERT INTO t1 VALUES (42, 'new')")
    vtgate.execute(keyspace, "INSERT INTO t2 VALUES ('b', 2, 'mid')")
    # vtgate only lists a table in table_p_ks once its copy started: the client names the tables
    # it has not copied yet with an empty lastpk
    resume = b.VGtid()
    resume.CopyFrom(vgtid)
    resume.shard_gtids[0].table_p_ks.append(b.TableLastPK(table_name="t2"))
    with Drain(vtgate.address, request(keyspace, vgtid=resume)) as second:
        more = second.until(lambda ev: any(e.type == b.COPY_COMPLETED and not e.keyspace for e in ev))
    model: dict = {}
    apply(model, committed)
    apply(model, more)
    assert model[f"{keyspace}.t1"] == {
        k: [x for x in v] for k, v in rows_in(vtgate, keyspace, "t1", 1).items()
    }
    t2 = {}
    apply(t2, [e for e in committed + more if e.type == b.ROW and e.row_event.table_name.endswith(".t2")], 2)
    assert t2[f"{keyspace}.t2"] == rows_in(vtgate, keyspace, "t2", 2)
    inserts = [after[0] for before, after in rows_of(committed + more, f"{keyspace}.t1") if before is None]
    # at least once, as vttablet's catch-up does (uvstreamer.go shouldSendEventForTable): the insert
    # of 42 and the update of 8 (above the last copied key 3) are sent, and both rows copied again
    assert sorted(inserts, key=int) == [str(i).encode() for i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 42, 42]]
    updates = [(b[0], a[1]) for b, a in rows_of(more, f"{keyspace}.t1") if b is not None and a is not None]
    assert (b"8", b"above") in updates and (b"1", b"below") in updates
    # t2's copy had not started: its insert is dropped and copied later
    assert [a[0] for _, a in rows_of(more, f"{keyspace}.t2")].count(b"b") == 1


def test_copy_framing_as_real_vtgate_sends_it(vtgate, shard_servers, keyspace):
    """No LASTPK reaches a client: vtgate turns it into a VGTID with ``table_p_ks``
    (``vstream_manager.go``: ``sendEventsLocked``).  From an empty GTID the first chunk opens with
    FIELD and the snapshot's VGTID; an empty table nests a BEGIN in its FIELD's (``copy.go``)."""
    from airflow_cdc.sources.vitess import offsets
    from airflow_cdc.sources.vitess.window import read_window
    from tests.integration.vitess.test_vitess_window import client_for

    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, [*SCHEMA, "CREATE TABLE t3 (id INT PRIMARY KEY)"])
    for i in range(6):
        vtgate.execute(keyspace, "INSERT INTO t1 VALUES (%s, %s)", (i, f"v{i}"))
    with Drain(vtgate.address, request(keyspace, gtid="")) as drain:
        events = drain.until(lambda ev: any(e.type == b.COPY_COMPLETED and not e.keyspace for e in ev))
    assert b.LASTPK not in {e.type for e in events}
    first = transactions(events)[0]
    assert kinds(first) == ["BEGIN", "FIELD", "VGTID", *["ROW"] * 4, "VGTID", "COMMIT"]
    assert first[2].vgtid.shard_gtids[0].gtid == first[-2].vgtid.shard_gtids[0].gtid
    assert not first[2].vgtid.shard_gtids[0].table_p_ks and first[-2].vgtid.shard_gtids[0].table_p_ks
    names = kinds(events)
    empty = [
        i for i, e in enumerate(events) if e.type == b.FIELD and e.field_event.table_name.endswith(".t2")
    ]
    assert names[empty[0] - 1 : empty[0] + 4] == ["BEGIN", "FIELD", "BEGIN", "VGTID", "COMMIT"]
    client = client_for(vtgate.address, keyspace)
    try:
        target = client.current_vgtid(keyspace)
        window = read_window(
            client, offsets.start_vgtid(keyspace, None, ""), target, None, 10**9, idle_timeout=10
        )
    finally:
        client.close()
    assert window.copy_chunks == 2 and window.copy_completed
    assert {(t.kind, c.op) for t in window.transactions for c in t.changes} == {("copy", "r")}


def test_tables_to_copy_current_start_and_a_table_without_key(vtgate, shard_servers, keyspace):
    """As vttablet v24 copies (``uvstreamer.go`` ``buildTablePlan``, ``init``; ``rowstreamer.go``
    ``buildPKColumns``): a VGTID naming one table copies every table the filter matches unless
    ``tables_to_copy`` names the ones to copy; ``current`` with a table named copies it; a table
    without a primary key comes in order of all its columns, duplicates across chunks included
    (one query per table and call, paged in its snapshot)."""
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, [*SCHEMA, "CREATE TABLE nk (a INT, b VARCHAR(5))"])
    vtgate.execute(keyspace, "INSERT INTO t1 VALUES (1, 'x')")
    vtgate.execute(
        keyspace, "INSERT INTO nk VALUES (2, 'b'), (1, NULL), (1, 'a'), (1, 'a'), (1, 'a'), (1, 'a')"
    )
    named = [b.TableLastPK(table_name="nk")]
    with Drain(vtgate.address, request(keyspace, gtid="", shard="0", table_p_ks=named)) as drain:
        events = drain.until(lambda ev: any(e.type == b.COPY_COMPLETED and not e.keyspace for e in ev))
    assert {e.field_event.table_name.split(".")[1] for e in events if e.type == b.FIELD} == {"nk", "t1", "t2"}
    # a named shard: vtgate drops table_p_ks of a keyspace-wide entry (resolveParams)
    req = request(keyspace, gtid="current", shard="0", table_p_ks=named, tables_to_copy=["nk"])
    with Drain(vtgate.address, req) as drain:
        events = drain.until(lambda ev: any(e.type == b.COPY_COMPLETED and not e.keyspace for e in ev))
    assert kinds(events)[:2] == ["VGTID", "OTHER"]
    assert {e.field_event.table_name for e in events if e.type == b.FIELD} == {f"{keyspace}.nk"}
    chunks = [t for t in transactions(events) if rows_of(t)]
    assert len(chunks) == 2, "copy_chunk_rows=4: the equal rows straddle two chunks"
    assert [a for _, a in rows_of(events)] == [[b"1", None]] + [[b"1", b"a"]] * 4 + [[b"2", b"b"]]
