"""``column.include.list`` / ``column.exclude.list`` on every contract source: a dropped column is in
no staged event (snapshot, insert, update, delete) nor file, key columns are always kept, and the
replay equals the source on the kept columns.  (SQL Server ignored both lists until this test.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.contract.harness import DB_FIXTURES, HARNESSES, Harness
from tests.support.pipeline import replay, run_capture, snapshot_pending

pytestmark = pytest.mark.integration
SECRET = "s3cr3t-column-value"


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    db = request.getfixturevalue(DB_FIXTURES[request.param])
    return HARNESSES[request.param](db, tmp_path / "staging")


def _staged(h: Harness) -> str:
    staged = getattr(h, "staged", None)
    return staged(h.table("cf")) if staged else h.table("cf")


@pytest.mark.parametrize("mode", ["exclude", "include"])
def test_filtered_columns_are_never_staged(harness: Harness, mode: str) -> None:
    h = harness
    h.execute(f"CREATE TABLE {h.q('cf')} (id int PRIMARY KEY, v varchar(40), secret varchar(40), n int)")
    h.execute(*(f"INSERT INTO {h.q('cf')} VALUES ({i}, 'v{i}', '{SECRET}{i}', {i})" for i in range(1, 6)))
    table = h.table("cf")
    props = (
        {"column.exclude.list": f"{table}.secret,{table}.id"}  # the key is kept all the same
        if mode == "exclude"
        else {"column.include.list": f"{table}.v,{table}.n"}
    )
    config = h.config(**{"table.include.list": table, "incremental.snapshot.chunk.size": 2}, **props)
    while snapshot_pending(config):
        run_capture(config)
    h.execute(
        f"INSERT INTO {h.q('cf')} VALUES (9, 'v9', '{SECRET}9', 9)",
        f"UPDATE {h.q('cf')} SET secret = '{SECRET}x', v = 'V2' WHERE id = 2",
        f"DELETE FROM {h.q('cf')} WHERE id = 3",
    )
    run_capture(config)
    rows = replay(config).rows(_staged(h))
    assert {k: {c: r[c] for c in ("id", "v", "n")} for k, r in rows.items()} == {
        (i,): {"id": i, "v": "V2" if i == 2 else f"v{i}", "n": i} for i in (1, 2, 4, 5, 9)
    }
    assert all(set(r) == {"id", "v", "n"} for r in rows.values()), "only the kept columns are staged"
    files = list(Path(config["staging.path"]).rglob("*.parquet"))
    assert files
    for f in files:
        assert SECRET.encode() not in f.read_bytes()
        assert "secret" not in str(pq.read_schema(f))
