"""Resharding a keyspace from one shard to two (``-80``, ``80-``) under a running VStream: every change
arrives exactly once, the VGTID moves from the old shard to the new ones, and ``stop_on_reshard``
ends the stream with the journal transaction (``BEGIN, JOURNAL, VGTID, COMMIT``)."""

from __future__ import annotations

import time

import pytest

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.testing.vitess_emulator.values import in_range, keyspace_id
from tests.integration.vitess.support import Drain, kinds, request, rows_of

SCHEMA = ["CREATE TABLE orders (id BIGINT PRIMARY KEY, qty INT)"]


def test_hash_vindex_matches_vitess():
    # Vitess's own hash vindex test vectors: 1 -> 166b40b44aba4bd6, 2 -> 06e7ea22ce92708f
    assert keyspace_id(1).hex() == "166b40b44aba4bd6"
    assert keyspace_id(2).hex() == "06e7ea22ce92708f"
    assert in_range(keyspace_id(1), "-80") and not in_range(keyspace_id(1), "80-")


@pytest.fixture
def resharded(vtgate, shard_servers, keyspace):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, SCHEMA)
    for i in range(1, 21):
        vtgate.execute(keyspace, "INSERT INTO orders VALUES (%s, %s)", (i, i), key=i)
    return keyspace


def _model(events: list[b.VEvent]) -> dict:
    model: dict = {}
    for before, after in rows_of(events):
        if before is not None:
            model.pop(before[0], None)
        if after is not None:
            model[after[0]] = after
    return model


def test_reshard_one_to_two_keeps_every_event_once(vtgate, shard_servers, resharded):
    ks = resharded
    with Drain(vtgate.address, request(ks)) as drain:
        drain.until(lambda ev: b.OTHER in [e.type for e in ev])
        for i in range(1, 11):
            vtgate.execute(ks, "UPDATE orders SET qty = qty + 100 WHERE id = %s", (i,), key=i)
        vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
        for i in range(11, 31):
            vtgate.execute(
                ks, "INSERT INTO orders VALUES (%s, %s) ON DUPLICATE KEY UPDATE qty = -qty", (i, i), key=i
            )
        drain.until(lambda ev: len(rows_of(ev)) >= 30)
        time.sleep(1)  # a duplicate would arrive right after
        events = drain.events
        assert drain.error is None and not drain.ended, (
            drain.error,
            len(rows_of(events)),
            kinds(events)[-30:],
        )
    assert len(rows_of(events)) == 30
    shards_of_rows = [e.row_event.shard for e in events if e.type == b.ROW]
    assert shards_of_rows[:10] == ["0"] * 10 and set(shards_of_rows[10:]) == {"-80", "80-"}
    for e in events:
        if e.type == b.ROW and e.row_event.shard != "0":
            key = int(rows_of([e])[0][1][0])
            assert in_range(keyspace_id(key), e.row_event.shard)
    vgtids = [[(g.shard) for g in e.vgtid.shard_gtids] for e in events if e.type == b.VGTID]
    switch = vgtids.index(["-80", "80-"]) if ["-80", "80-"] in vgtids else vgtids.index(["80-", "-80"])
    assert all(v == ["0"] for v in vgtids[:switch]) and all(set(v) == {"-80", "80-"} for v in vgtids[switch:])
    assert b.JOURNAL not in [e.type for e in events]
    # start: 20 rows; then the stream; compare with the union of the new shards
    model = {str(i).encode(): [str(i).encode(), str(i).encode()] for i in range(1, 21)}
    model.update(_model(events))
    union = {}
    for shard in vtgate.keyspace_shards(ks):
        for row in shard.server.execute("SELECT id, qty FROM orders", database=shard.database):
            union[str(row[0]).encode()] = [str(row[0]).encode(), str(row[1]).encode()]
    assert model == union and len(union) == 30


def test_stop_on_reshard_sends_the_journal_and_ends(vtgate, shard_servers, resharded):
    ks = resharded
    with Drain(vtgate.address, request(ks, stop_on_reshard=True)) as drain:
        drain.until(lambda ev: b.OTHER in [e.type for e in ev])
        vtgate.execute(ks, "UPDATE orders SET qty = 0 WHERE id = 1")
        journal = vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
        vtgate.execute(ks, "UPDATE orders SET qty = 7 WHERE id = 2", key=2)
        events = drain.until(lambda ev: False, timeout=20) if not drain.ended else drain.events
    assert drain.ended and drain.error is None
    # vtgate v24 sends the journal inside its transaction, the VGTID still naming the old shard
    assert kinds(events)[-4:] == ["BEGIN", "JOURNAL", "VGTID", "COMMIT"]
    assert events[-3].journal == journal and [g.shard for g in events[-2].vgtid.shard_gtids] == ["0"]
    assert [(p.keyspace, p.shard) for p in journal.participants] == [(ks, "0")]
    assert sorted(g.shard for g in journal.shard_gtids) == ["-80", "80-"]
    assert len(rows_of(events)) == 1
    # the client continues from the journal's positions and sees the later write once
    with Drain(vtgate.address, request(ks, vgtid=b.VGtid(shard_gtids=journal.shard_gtids))) as after:
        more = after.until(lambda ev: len(rows_of(ev)) >= 1)
    assert rows_of(more) == [([b"2", b"2"], [b"2", b"7"])]


def test_new_shards_serve_before_the_journal_is_written(vtgate, shard_servers, resharded, monkeypatch):
    """A stream reads the journal as soon as it is in the old shard's binlog and opens the new
    shards at once: they must already be registered (a busy machine once saw "no healthy tablet")."""
    ks = resharded
    source = vtgate.keyspace_shards(ks)[0].server
    seen: list[set[str]] = []
    execute = source.execute

    def watching(sql: str, *args, **kwargs):
        if "INSERT INTO" in sql and "journal" in sql.lower():
            seen.append({name for (k, name) in vtgate.all_shards if k == ks})
        return execute(sql, *args, **kwargs)

    monkeypatch.setattr(source, "execute", watching)
    vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
    assert seen and all({"-80", "80-"} <= names for names in seen)
