"""Column mappers on Vitess (the seed documents ``column.truncate.to``; the masks and hashes apply
the same way): copy-phase rows and streamed insert/update/delete events are staged exactly as
Debezium maps them, and no staged file holds an unmapped value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.errors import ConfigError
from tests.integration.vitess.capture_support import vitess_props
from tests.support import mappers as mp
from tests.support.pipeline import run_capture

DDL = (
    "CREATE TABLE masked (id BIGINT PRIMARY KEY, t VARCHAR(40), m VARCHAR(40), h1 TEXT, "
    "h2 VARCHAR(40), plain VARCHAR(40)) DEFAULT CHARSET=utf8mb4"
)


def _insert(vtgate: Any, ks: str, rows: list[dict[str, Any]]) -> None:
    for r in rows:
        vtgate.execute(
            ks,
            f"INSERT INTO masked (id, {', '.join(mp.COLUMNS)}) VALUES (%s, %s, %s, %s, %s, %s)",
            [r["id"], *(r[c] for c in mp.COLUMNS)],
            key=r["id"],
        )


def test_copy_and_stream_are_mapped_and_never_unmapped(vtgate, shard_servers, keyspace, tmp_path: Path):
    ks = keyspace
    vtgate.add_keyspace(ks, {"0": shard_servers[0]}, [DDL])
    snap = [mp.row(1, "ascii"), mp.row(2, "utf8"), mp.row(3, "empty"), mp.row(4, "null")]
    _insert(vtgate, ks, snap)
    props = vitess_props(vtgate, ks, tmp_path / "staging", **mp.mapper_props(f"{ks}.masked"))
    assert run_capture(props).snapshot_rows == 4
    new, updated = mp.row(5, "utf8"), mp.row(1, "utf8", "u")
    _insert(vtgate, ks, [new])
    sets = ", ".join(f"{c} = %s" for c in mp.COLUMNS)
    vtgate.execute(ks, f"UPDATE masked SET {sets} WHERE id = 1", [updated[c] for c in mp.COLUMNS], key=1)
    vtgate.execute(ks, "DELETE FROM masked WHERE id = 2", key=2)
    run_capture(props)
    want = [("r", None, r) for r in snap]
    want += [("c", None, new), ("u", snap[0], updated), ("d", snap[1], None)]
    # Debezium's Vitess columns carry no length: the hash of h2 is not cut
    mp.assert_events(mp.staged_events(props, f"{ks}.masked"), want, h2_length=-1)
    mp.assert_no_unmapped_value(tmp_path / "staging", [*snap, new, updated])


def test_a_truncated_key_column_is_refused(vtgate, shard_servers, keyspace, tmp_path: Path):
    ks = keyspace
    vtgate.add_keyspace(
        ks, {"0": shard_servers[0]}, ["CREATE TABLE keyed (k VARCHAR(20) PRIMARY KEY, n INT)"]
    )
    vtgate.execute(ks, "INSERT INTO keyed VALUES ('a', 1)")
    props = vitess_props(vtgate, ks, tmp_path / "staging", **{"column.truncate.to.1.chars": f"{ks}.keyed.k"})
    with pytest.raises(ConfigError, match=r"key column 'k'.*column.truncate.to.1.chars"):
        run_capture(props)
    assert not list((tmp_path / "staging").rglob("*.parquet"))
