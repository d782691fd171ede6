"""A chunk's watermark from ``pg_current_snapshot()`` text, on a primary and on a standby."""

from __future__ import annotations

from airflow_cdc.sources.postgres.source import parse_snapshot


def test_primary_snapshot_sees_what_it_lists_as_done() -> None:
    w = parse_snapshot("732:734:732", 100)
    assert w.sees(731) and w.sees(733)
    assert not w.sees(732) and not w.sees(734)


def test_standby_snapshot_sees_only_below_xmin() -> None:
    """On a standby the text lists no running xid ('732:734:' while 732 runs on the primary,
    measured on PostgreSQL 16): nothing from xmin on may count as seen."""
    w = parse_snapshot("732:734:", 100, standby=True)
    assert w.sees(731)
    assert not w.sees(732) and not w.sees(733) and not w.sees(734)
    assert w.lsn_after == 100


def test_standby_watermark_wraps_around() -> None:
    w = parse_snapshot("4294967290:5:", 1, standby=True)
    assert w.sees(4294967289)
    assert not w.sees(4294967295) and not w.sees(2)
