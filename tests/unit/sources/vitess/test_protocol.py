"""Copy chunks told from binlog transactions in the shapes real vtgate v24 sends.

vttablet's copy (``copy.go``: ``sendFieldEvent``, ``sendEventsForRows``, ``copyComplete``) as
vtgate relays it (``vstream_manager.go``: ``sendEventsLocked`` turns GTID and LASTPK into VGTIDs,
the latter with ``table_p_ks``); shapes observed on a real cluster over MariaDB shards.
"""

from __future__ import annotations

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.sources.vitess.proto import query_pb2 as q
from airflow_cdc.sources.vitess.protocol import Assembler, Transaction

KS, SHARD, TABLE = "ks", "-80", "ks.customer"
G, G2, G3 = "MariaDB/0-1-31", "MariaDB/0-1-32", "MariaDB/0-1-33"
FIELDS = [q.Field(name="id", type=q.INT64), q.Field(name="name", type=q.VARCHAR)]


def ev(kind: int, **kw) -> b.VEvent:  # type: ignore[no-untyped-def]
    return b.VEvent(type=kind, keyspace=KS, shard=SHARD, **kw)


def vgtid(gtid: str, lastpk: int | None = None) -> b.VEvent:
    g = b.ShardGtid(keyspace=KS, shard=SHARD, gtid=gtid)
    if lastpk is not None:
        pk = q.QueryResult(
            fields=FIELDS[:1], rows=[q.Row(lengths=[len(str(lastpk))], values=str(lastpk).encode())]
        )
        g.table_p_ks.append(b.TableLastPK(table_name="customer", lastpk=pk))
    return ev(b.VGTID, vgtid=b.VGtid(shard_gtids=[g]))


def row(i: int, before: bool = False) -> b.VEvent:
    r = q.Row(lengths=[len(str(i)), 1], values=f"{i}n".encode())
    change = b.RowChange(before=r) if before else b.RowChange(after=r)
    return ev(b.ROW, row_event=b.RowEvent(table_name=TABLE, row_changes=[change], keyspace=KS, shard=SHARD))


FIELD = ev(b.FIELD, field_event=b.FieldEvent(table_name=TABLE, fields=FIELDS))
BEGIN, COMMIT = ev(b.BEGIN), ev(b.COMMIT)


def feed(events: list[b.VEvent], start: b.VGtid | None = None) -> list[Transaction]:
    a = Assembler(start)
    return [item for e in events for item in a.feed(e) if isinstance(item, Transaction)]


def test_first_chunk_after_an_empty_start_is_a_copy() -> None:
    start = b.VGtid(shard_gtids=[b.ShardGtid(keyspace=KS, shard=SHARD, gtid="")])
    txns = feed(
        [BEGIN, FIELD, vgtid(G), row(1), row(2), vgtid(G, 2), COMMIT,
         BEGIN, row(3), vgtid(G, 3), COMMIT,
         BEGIN, vgtid(G), COMMIT,
         BEGIN, row(4), vgtid(G2), COMMIT],
        start,
    )  # fmt: skip
    assert [(t.kind, [c.op for c in t.changes]) for t in txns] == [
        ("copy", ["r", "r"]), ("copy", ["r"]), ("commit", []), ("commit", ["c"])
    ]  # fmt: skip


def test_resumed_chunk_without_a_leading_vgtid_is_a_copy() -> None:
    start = vgtid(G, 2).vgtid
    txns = feed([BEGIN, FIELD, row(3), vgtid(G, 3), COMMIT], start)
    assert [(t.kind, [c.op for c in t.changes]) for t in txns] == [("copy", ["r"])]


def test_catch_up_commits_during_a_copy_stay_commits() -> None:
    """A binlog transaction between tables carries the shard's table_p_ks too, but moves its GTID."""
    txns = feed(
        [BEGIN, FIELD, row(9), vgtid(G2, 3), COMMIT, BEGIN, row(9, before=True), vgtid(G3, 3), COMMIT],
        vgtid(G, 3).vgtid,
    )
    assert [(t.kind, [c.op for c in t.changes]) for t in txns] == [("commit", ["c"]), ("commit", ["d"])]


def test_unmoved_gtid_without_table_p_ks_is_no_copy() -> None:
    txns = feed([BEGIN, FIELD, row(9), vgtid(G), COMMIT], vgtid(G).vgtid)
    assert [t.kind for t in txns] == ["commit"]


def test_empty_table_nests_a_begin() -> None:
    start = b.VGtid(shard_gtids=[b.ShardGtid(keyspace=KS, shard=SHARD, gtid="")])
    txns = feed([BEGIN, FIELD, vgtid(G), BEGIN, vgtid(G), COMMIT, BEGIN, row(5), vgtid(G2), COMMIT], start)
    assert [(t.kind, len(t.changes)) for t in txns] == [("commit", 0), ("commit", 1)]
    assert txns[1].changes[0].op == "c"
