"""``column.propagate.source.type`` / ``datatype.propagate.source.type`` for Vitess: the type comes
from the FIELD events' ``column_type``, in copy and stream parts alike."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from tests.integration.vitess.capture_support import SCHEMA, order_values, vitess_props
from tests.support.pipeline import run_capture, snapshot_pending

INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"


def _params(field) -> dict[str, str]:
    meta = field.metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if k.startswith(b"__debezium.source.column.")}


def test_vitess_propagates_source_types(vtgate, shard_servers, keyspace, tmp_path: Path):
    vtgate.add_keyspace(keyspace, {"0": shard_servers[0]}, SCHEMA)
    vtgate.execute(keyspace, INSERT, order_values(1))
    props = vitess_props(vtgate, keyspace, tmp_path, **{
        "column.propagate.source.type": f"{keyspace}.orders.item", "datatype.propagate.source.type": r".+\.decimal",
    })  # fmt: skip
    while snapshot_pending(props):
        run_capture(props)
    vtgate.execute(keyspace, INSERT, order_values(2))
    run_capture(props)
    parts = list(tmp_path.rglob("*.parquet"))
    assert len(parts) >= 2
    for part in parts:
        after = pq.read_schema(part).field("after").type
        fields = {after.field(i).name: after.field(i) for i in range(after.num_fields)}
        assert _params(fields["item"]) == {
            "__debezium.source.column.type": "VARCHAR", "__debezium.source.column.length": "40",
            "__debezium.source.column.name": "item",
        }  # fmt: skip
        assert _params(fields["price"]) == {
            "__debezium.source.column.type": "DECIMAL",
            "__debezium.source.column.length": "10",
            "__debezium.source.column.scale": "2",
            "__debezium.source.column.name": "price",
        }
        assert _params(fields["qty"]) == {}
