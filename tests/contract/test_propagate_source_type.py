"""``column.propagate.source.type`` / ``datatype.propagate.source.type`` on every contract source:
the staged field of a matching column carries Debezium's schema parameters
(``__debezium.source.column.type`` / ``.length`` / ``.scale``) in its Parquet field metadata, in
snapshot and change parts; other columns carry none; values are unchanged."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.contract.harness import DB_FIXTURES, HARNESSES, Harness
from tests.support.pipeline import replay, run_capture, snapshot_pending

pytestmark = pytest.mark.integration
TYPES = {  # the source's own type names, as each Debezium connector reports them
    "postgresql": ("VARCHAR", "NUMERIC"),
    "mariadb": ("VARCHAR", "DECIMAL"),
    "sqlserver": ("varchar", "decimal"),
}


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    db = request.getfixturevalue(DB_FIXTURES[request.param])
    return HARNESSES[request.param](db, tmp_path / "staging")


def _params(field) -> dict[str, str]:
    meta = field.metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if k.startswith(b"__debezium.source.column.")}


def test_source_types_are_propagated(harness: Harness) -> None:
    h = harness
    h.execute(f"CREATE TABLE {h.q('pt')} (id int PRIMARY KEY, v varchar(40), amount decimal(10,2), n int)")
    h.execute(f"INSERT INTO {h.q('pt')} VALUES (1, 'a', 12.34, 5)")
    table = h.table("pt")
    config = h.config(**{
        "table.include.list": table, "column.propagate.source.type": f"{table}.v",
        "datatype.propagate.source.type": r".+\.decimal,.+\.numeric",  # case-insensitive, as Debezium
    })  # fmt: skip
    while snapshot_pending(config):
        run_capture(config)
    h.execute(f"UPDATE {h.q('pt')} SET amount = 99.5 WHERE id = 1")
    run_capture(config)
    varchar, decimal = TYPES[h.name]
    parts = list(Path(config["staging.path"]).rglob("*.parquet"))
    assert len(parts) >= 2  # the snapshot's part and the change's
    for part in parts:
        after = pq.read_schema(part).field("after").type
        fields = {after.field(i).name: after.field(i) for i in range(after.num_fields)}
        assert _params(fields["v"]) == {
            "__debezium.source.column.type": varchar, "__debezium.source.column.length": "40",
            "__debezium.source.column.name": "v", **({"__debezium.source.column.scale": "0"} if h.name == "postgresql" else {}),
        }  # fmt: skip
        assert _params(fields["amount"]) == {
            "__debezium.source.column.type": decimal,
            "__debezium.source.column.length": "10",
            "__debezium.source.column.scale": "2",
            "__debezium.source.column.name": "amount",
        }
        assert _params(fields["id"]) == {} and _params(fields["n"]) == {}
    staged = getattr(h, "staged", None)
    [row] = replay(config).rows(staged(table) if staged else table).values()
    assert row["v"] == "a" and row["n"] == 5
