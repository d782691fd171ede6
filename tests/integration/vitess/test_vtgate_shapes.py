"""Shapes real vtgate (v24) sends that the emulator once lacked, and the source against them.

* COPY_COMPLETED: every copying shard sends its own (keyspace and shard set); vtgate adds the
  keyspace-wide one (neither set) only once every shard of the call's VGTID sent its own, so a copy
  resumed on only some shards never gets it (``go/vt/vtgate/vstream_manager.go``:
  ``isCopyFullyCompleted``; ``go/vt/vttablet/tabletserver/vstreamer/uvstreamer.go``: ``Stream``).
* ``stop_on_reshard``: each participant sends ``BEGIN, JOURNAL, VGTID, COMMIT``, the VGTID still
  naming the old shards (``vstream_manager.go``: ``streamFromTablet``, ``getJournalEvent``).

The source tests are issue 32's items 1 and 2: both lost data silently before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as b
from airflow_cdc.testing.vitess_emulator.values import in_range, keyspace_id
from tests.integration.vitess.capture_support import SCHEMA, order_values, shard_rows, vitess_props
from tests.integration.vitess.support import Drain, kinds, last_vgtid, request, rows_of, transactions
from tests.support.pipeline import assert_rows_equal, replay, run_capture

INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"


def keys_of(shard: str, count: int, start: int = 1) -> list[int]:
    """The first ``count`` integer keys from ``start`` that the hash vindex routes to ``shard``."""
    out, key = [], start
    while len(out) < count:
        if in_range(keyspace_id(key), shard):
            out.append(key)
        key += 1
    return out


@pytest.fixture
def uneven(vtgate, shard_servers, keyspace):
    """Two shards: ``-80`` with 2 rows (less than one copy chunk), ``80-`` with 30."""
    vtgate.add_keyspace(keyspace, {"-80": shard_servers[1], "80-": shard_servers[2]}, SCHEMA)
    for key in keys_of("-80", 2) + keys_of("80-", 30):
        vtgate.execute(keyspace, INSERT, order_values(key), key=key)
    return keyspace


def _copy_completed(events: list[b.VEvent]) -> list[tuple[str, str]]:
    return [(e.keyspace, e.shard) for e in events if e.type == b.COPY_COMPLETED]


# -- the emulator's shapes --------------------------------------------------------------------
def test_keyspace_wide_copy_completed_only_after_every_shard(vtgate, uneven):
    ks = uneven
    full = b.VGtid(shard_gtids=[b.ShardGtid(keyspace=ks, shard=s, gtid="") for s in ("-80", "80-")])
    with Drain(vtgate.address, request(ks, vgtid=full)) as drain:
        events = drain.until(lambda ev: ("", "") in _copy_completed(ev))
    assert sorted(_copy_completed(events)) == [("", ""), (ks, "-80"), (ks, "80-")]
    assert _copy_completed(events)[-1] == ("", ""), "the keyspace-wide one comes last"
    assert kinds(events)[-2:] == ["COPY_COMPLETED", "COPY_COMPLETED"]


def test_copy_resumed_on_one_shard_never_sends_the_keyspace_wide_one(vtgate, uneven):
    ks = uneven
    done = last_vgtid(_drain_copy(vtgate, ks))  # both shards copied: positions without table_p_ks
    resume = b.VGtid()
    resume.CopyFrom(done)
    copying = next(g for g in resume.shard_gtids if g.shard == "80-")
    copying.table_p_ks.append(b.TableLastPK(table_name="orders"))  # copy orders again on 80- only
    with Drain(vtgate.address, request(ks, vgtid=resume)) as drain:
        drain.until(lambda ev: (ks, "80-") in _copy_completed(ev))
        low = keys_of("-80", 1)[0]
        vtgate.execute(ks, "UPDATE orders SET qty = 0 WHERE id = %s", (low,), key=low)
        events = drain.until(lambda ev: len([r for r in rows_of(ev) if r[0] is not None]) >= 1)
    assert _copy_completed(events) == [(ks, "80-")], "no COPY_COMPLETED for -80, none keyspace-wide"
    assert len([r for r in rows_of(events) if r[0] is None]) == 30, "80- copied again"


def _drain_copy(vtgate, ks: str) -> list[b.VEvent]:
    full = b.VGtid(shard_gtids=[b.ShardGtid(keyspace=ks, shard=s, gtid="") for s in ("-80", "80-")])
    with Drain(vtgate.address, request(ks, vgtid=full)) as drain:
        return drain.until(lambda ev: ("", "") in _copy_completed(ev))


def test_stop_on_reshard_sends_the_journal_transaction(vtgate, shard_servers, keyspace):
    ks = keyspace
    vtgate.add_keyspace(ks, {"0": shard_servers[0]}, SCHEMA)
    vtgate.execute(ks, INSERT, order_values(1))
    with Drain(vtgate.address, request(ks, stop_on_reshard=True)) as drain:
        drain.until(lambda ev: b.OTHER in [e.type for e in ev])
        journal = vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
        events = drain.until(lambda ev: False, timeout=20) if not drain.ended else drain.events
    assert drain.ended and drain.error is None
    last = transactions(events)[-1]
    assert kinds(last) == ["BEGIN", "JOURNAL", "VGTID", "COMMIT"]
    assert last[1].journal == journal and (last[1].keyspace, last[1].shard) == (ks, "0")
    assert [g.shard for g in last[2].vgtid.shard_gtids] == ["0"], "the VGTID still names the old shard"
    assert last[2].vgtid.shard_gtids[0].gtid != ""


# -- the source against them ------------------------------------------------------------------
def test_copy_resumed_on_some_shards_converges_with_default_settings(vtgate, uneven, tmp_path: Path):
    """Issue 32 item 1: a first run bounded by ``run.max.events`` leaves ``-80`` copied and ``80-``
    copying; the runs after it (default settings) finish the copy on their own shard's
    COPY_COMPLETED instead of waiting for the keyspace-wide one that never comes."""
    ks = uneven
    props = vitess_props(vtgate, ks, tmp_path)
    first = run_capture(dict(props, **{"run.max.events": 5}))
    copying = sorted(g["shard"] for g in first.to_offset["vgtid"] if g.get("table_p_ks"))
    assert copying == ["80-"], first.to_offset
    low, high = keys_of("-80", 2), keys_of("80-", 30)
    vtgate.execute(ks, "UPDATE orders SET qty = -1 WHERE id = %s", (low[0],), key=low[0])
    vtgate.execute(ks, "DELETE FROM orders WHERE id = %s", (high[-1],), key=high[-1])
    for key in keys_of("-80", 2, start=1000) + keys_of("80-", 2, start=1000):
        vtgate.execute(ks, INSERT, order_values(key), key=key)
    runs = []
    for _ in range(4):
        runs.append(run_capture(props))
        if not any(g.get("table_p_ks") for g in runs[-1].to_offset["vgtid"]) and not runs[-1].events:
            break
    assert len(runs) <= 3, [r.to_offset for r in runs]
    assert first.snapshot_rows + sum(r.snapshot_rows for r in runs) >= 32
    assert_rows_equal("orders", shard_rows(vtgate, ks), replay(props).rows(f"{ks}.orders"))


def test_stop_on_reshard_reads_the_new_shards_afterwards(vtgate, shard_servers, keyspace, tmp_path: Path):
    """Issue 32 item 2: the journal transaction's VGTID (old shard) must not replace the journal's
    new shards in the offset; the runs after the reshard read the rows written to the new shards."""
    ks = keyspace
    vtgate.add_keyspace(ks, {"0": shard_servers[0]}, SCHEMA)
    for i in range(1, 11):
        vtgate.execute(ks, INSERT, order_values(i))
    props = vitess_props(vtgate, ks, tmp_path, **{"vitess.stop_on_reshard": True})
    assert run_capture(props).snapshot_rows == 10
    vtgate.execute(ks, "UPDATE orders SET qty = 0 WHERE id = 1")
    vtgate.reshard(ks, {"-80": shard_servers[1], "80-": shard_servers[2]})
    for i in range(11, 21):
        vtgate.execute(ks, INSERT, order_values(i), key=i)
    results = [run_capture(props)]
    while results[-1].events and len(results) < 5:
        results.append(run_capture(props))
    assert sorted(g["shard"] for g in results[-1].to_offset["vgtid"]) == ["-80", "80-"]
    assert sum(r.events for r in results) == 11
    vtgate.execute(ks, "DELETE FROM orders WHERE id = 2", key=2)
    vtgate.execute(ks, INSERT, order_values(21), key=21)
    later = run_capture(props)
    assert later.events == 2
    assert_rows_equal("orders", shard_rows(vtgate, ks), replay(props).rows(f"{ks}.orders"))


def test_stop_on_reshard_window_waits_for_every_participants_journal(vtgate, shard_servers, keyspace):
    """A merge (``-80``, ``80-`` -> ``0``) has two participants, each sending the journal when its
    stream reaches it: a window bounded by ``max_events`` must not end between the two journals,
    or the second shard's last transactions before its journal would never be read."""
    from airflow_cdc.sources.vitess.window import read_window
    from tests.integration.vitess.test_vitess_window import client_for

    ks = keyspace
    vtgate.add_keyspace(ks, {"-80": shard_servers[1], "80-": shard_servers[2]}, SCHEMA)
    client = client_for(vtgate.address, ks, **{"vitess.stop_on_reshard": True})
    try:
        start = client.current_vgtid(ks)
        written = keys_of("-80", 2) + keys_of("80-", 2)
        for key in written:
            vtgate.execute(ks, INSERT, order_values(key), key=key)
        vtgate.reshard(ks, {"0": shard_servers[0]})
        vtgate.execute(ks, INSERT, order_values(9999))
        seen, windows = [], []
        while len(windows) < 10:
            window = read_window(client, start, client.current_vgtid(ks), None, 1, idle_timeout=10)
            windows.append(window)
            seen += [c.after["id"] for t in window.transactions for c in t.changes]
            if window.end == start:
                break
            start = window.end
    finally:
        client.close()
    assert [g.shard for g in start.shard_gtids] == ["0"]
    assert sorted(seen) == sorted([*written, 9999]), "every change exactly once"
    journals = [w for w in windows if w.journal is not None]
    assert len(journals) == 1 and sorted(p.shard for p in journals[0].journal.participants) == ["-80", "80-"]
