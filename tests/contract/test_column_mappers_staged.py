"""Column mappers (``column.truncate.to`` / ``column.mask.with`` / ``column.mask.hash[.v2]``) on every
contract source: snapshot rows and insert/update/delete events (before and after images) are staged
exactly as Debezium maps them, and no staged file holds an unmapped value (Vitess:
tests/integration/vitess/test_source_column_mappers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import ConfigError
from tests.contract.harness import DB_FIXTURES, HARNESSES, Harness
from tests.support import mappers as mp
from tests.support.pipeline import replay, run_capture, snapshot_pending

pytestmark = pytest.mark.integration

DDL = {
    "postgresql": (
        'CREATE TABLE "masked" (id int PRIMARY KEY, t text, m text, h1 text, h2 varchar(40), plain text)',
        'ALTER TABLE "masked" REPLICA IDENTITY FULL',  # before images with every column
    ),
    "mariadb": (
        "CREATE TABLE `masked` (id int PRIMARY KEY, t varchar(40), m varchar(40), h1 mediumtext, "
        "h2 varchar(40), plain varchar(40)) DEFAULT CHARSET=utf8mb4",
    ),
    "sqlserver": (
        "CREATE TABLE [masked] (id int PRIMARY KEY, t nvarchar(40), m nvarchar(40), h1 nvarchar(max), "
        "h2 nvarchar(40), plain nvarchar(40))",
    ),
}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    db = request.getfixturevalue(DB_FIXTURES[request.param])
    return HARNESSES[request.param](db, tmp_path / "staging")


def _literal(v: Any) -> str:
    return "NULL" if v is None else str(v) if isinstance(v, int) else f"'{v}'"


def _insert(h: Harness, rows: list[dict[str, Any]]) -> None:
    values = ", ".join("(" + ", ".join(_literal(r[c]) for c in ("id", *mp.COLUMNS)) + ")" for r in rows)
    h.execute(f"INSERT INTO {h.q('masked')} (id, {', '.join(mp.COLUMNS)}) VALUES {values}")


def _staged_name(h: Harness) -> str:
    staged = getattr(h, "staged", None)
    return staged(h.table("masked")) if staged else h.table("masked")


def test_mapped_columns_are_staged_mapped_and_never_unmapped(harness: Harness) -> None:
    h = harness
    h.execute(*DDL[h.name])
    snap = [mp.row(1, "ascii"), mp.row(2, "utf8"), mp.row(3, "empty"), mp.row(4, "null")]
    _insert(h, snap)
    config = h.config(
        **{"table.include.list": h.table("masked"), "incremental.snapshot.chunk.size": 3},
        **mp.mapper_props(h.table("masked")),
    )
    while snapshot_pending(config):
        run_capture(config)
    new, updated = mp.row(5, "utf8"), mp.row(1, "utf8", "u")
    _insert(h, [new])
    sets = ", ".join(f"{c} = {_literal(updated[c])}" for c in mp.COLUMNS)
    h.execute(f"UPDATE {h.q('masked')} SET {sets} WHERE id = 1", f"DELETE FROM {h.q('masked')} WHERE id = 2")
    run_capture(config)
    want = [("r", None, r) for r in snap]
    want += [("c", None, new), ("u", snap[0], updated), ("d", snap[1], None)]
    mp.assert_events(mp.staged_events(config, _staged_name(h)), want)
    mp.assert_no_unmapped_value(Path(config["staging.path"]), [*snap, new, updated])


KEY_DDL = {
    "postgresql": 'CREATE TABLE "keyed" (k varchar(20) PRIMARY KEY, n int)',
    "mariadb": "CREATE TABLE `keyed` (k varchar(20) PRIMARY KEY, n int) DEFAULT CHARSET=utf8mb4",
    "sqlserver": "CREATE TABLE [keyed] (k nvarchar(20) PRIMARY KEY, n int)",
}


def test_key_columns_only_take_a_hash(harness: Harness) -> None:
    """A mask or truncation of a key column is refused before anything is staged; a hash maps the
    key in every image, consistently, so updates and deletes still find their row."""
    h = harness
    h.execute(KEY_DDL[h.name], f"INSERT INTO {h.q('keyed')} (k, n) VALUES ('Kü-1', 1), ('Kü-2', 2)")
    table = h.table("keyed")
    for prop in ("column.mask.with.3.chars", "column.truncate.to.2.chars"):
        refused = h.config(**{"table.include.list": table, prop: f"{table}.k"})
        with pytest.raises(ConfigError, match=rf"key column 'k'.*{prop}"):
            run_capture(refused)
        assert not list(Path(refused["staging.path"]).rglob("*.parquet"))
    config = h.config(
        **{"table.include.list": table, f"column.mask.hash.v2.SHA-256.with.salt.{mp.SALT2}": f"{table}.k"}
    )
    while snapshot_pending(config):
        run_capture(config)
    h.execute(
        f"UPDATE {h.q('keyed')} SET n = 10 WHERE k = 'Kü-1'", f"DELETE FROM {h.q('keyed')} WHERE k = 'Kü-2'"
    )
    run_capture(config)

    def hashed(k: str) -> str:
        return mp.hashlib.sha256(mp.SALT2.encode() + k.encode()).hexdigest()[:20]  # varchar(20)

    staged = getattr(h, "staged", None)
    events = mp.staged_events(config, staged(table) if staged else table)
    # before images: the key (PostgreSQL's default replica identity sends no more)
    got = [(op, b and b["k"], a) for op, b, a in events]
    k1, k2 = hashed("Kü-1"), hashed("Kü-2")
    want = [
        ("r", None, {"k": k1, "n": 1}),
        ("r", None, {"k": k2, "n": 2}),
        ("u", None if h.name == "postgresql" else k1, {"k": k1, "n": 10}),
        ("d", k2, None),
    ]
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    # a key change: every image and the old key carry hashes; replayed, silver holds the new hash
    h.execute(f"UPDATE {h.q('keyed')} SET k = 'Kü-3' WHERE k = 'Kü-1'")
    run_capture(config)
    k3 = hashed("Kü-3")
    name = staged(table) if staged else table
    seen = set()
    for batch in list_batches(config["staging.path"], config["name"]):
        for rb in batch.iter_events(name):
            for r in rb.to_pylist():
                seen |= {img["k"] for img in (r["before"], r["after"], r.get("__old_key")) if img}
    assert seen == {k1, k2, k3}
    assert replay(config).rows(name) == {(k3,): {"k": k3, "n": 10}}
    for path in Path(config["staging.path"]).rglob("*"):
        assert not path.is_file() or "Kü-".encode() not in path.read_bytes(), path
