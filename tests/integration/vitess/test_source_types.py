"""Every type of the Debezium Vitess type table staged through the capture core: the copy-phase row
(``op=r``) and the streamed key change (``d`` + ``c``) carry the seed's encodings, and each column's
Arrow field carries its Connect schema name."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from airflow_cdc.core.batch import list_batches
from airflow_cdc.sources.postgres.types_base import META_NAME
from tests.integration.vitess.capture_support import vitess_props
from tests.integration.vitess.test_emulator_events import DDL, INSERT
from tests.integration.vitess.test_vitess_types import EXPECTED
from tests.support.pipeline import run_capture


def test_every_type_in_the_copy_and_the_stream(vtgate, shard_servers, keyspace, tmp_path: Path):
    ks = keyspace
    vtgate.add_keyspace(ks, {"0": shard_servers[0]}, [DDL])
    vtgate.execute(ks, INSERT)
    props = vitess_props(
        vtgate, ks, tmp_path, **{"column.exclude.list": f"{ks}.alltypes.b1,{ks}.alltypes.b10"}
    )
    assert run_capture(props).snapshot_rows == 1
    vtgate.execute(ks, "UPDATE alltypes SET id = 2")
    assert run_capture(props).tables[f"{ks}.alltypes"] == {"d": 1, "c": 1}
    first, second = list_batches(props["staging.path"], props["name"])[-2:]
    copied = [r for rb in first.iter_events(f"{ks}.alltypes") for r in rb.to_pylist()]
    streamed = [r for rb in second.iter_events(f"{ks}.alltypes") for r in rb.to_pylist()]
    assert [r["op"] for r in copied] == ["r"] and [r["op"] for r in streamed] == ["d", "c"]
    assert set(copied[0]["after"]) == set(EXPECTED)
    for name, (_, _, from_binlog, from_copy) in EXPECTED.items():
        assert copied[0]["after"][name] == from_copy, name
        assert streamed[0]["before"][name] == from_binlog, name
        assert streamed[1]["after"][name] == (2 if name == "id" else from_binlog), name
    schema = pq.read_schema(first.parts(f"{ks}.alltypes")[0])
    after = schema.field("after").type
    for name, (arrow, semantic, _, _) in EXPECTED.items():
        field = after.field(name)
        assert field.type == arrow, name
        assert (field.metadata or {}).get(META_NAME) == (semantic.encode() if semantic else None), name
