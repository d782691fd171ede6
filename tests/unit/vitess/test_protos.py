"""Our Vitess proto subset: the checked-in Python modules are what scripts/gen_vitess_protos.sh makes
of the .proto files, and the wire facts (packages, field numbers, enum values) are vtgate's."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

import pytest

from airflow_cdc.sources.vitess.proto import binlogdata_pb2, query_pb2, topodata_pb2, vtgate_pb2, vtrpc_pb2
from airflow_cdc.sources.vitess.proto import vtgateservice_pb2 as service

REPO = Path(__file__).resolve().parents[3]
PROTO_DIR = Path("airflow_cdc/sources/vitess/proto")


def test_checked_in_modules_match_the_protos(tmp_path):
    subprocess.run([str(REPO / "scripts/gen_vitess_protos.sh"), str(tmp_path)], check=True, cwd=REPO)
    generated = sorted(p.name for p in (tmp_path / PROTO_DIR).iterdir())
    checked_in = sorted(p.name for p in (REPO / PROTO_DIR).iterdir() if "_pb2" in p.name)
    assert generated == checked_in
    mismatch = filecmp.cmpfiles(tmp_path / PROTO_DIR, REPO / PROTO_DIR, generated, shallow=False)[1]
    assert mismatch == [], f"regenerate with scripts/gen_vitess_protos.sh: {mismatch}"


# (message, {field: number}) as in vitessio/vitess proto/ (v18.0.0; json_partial_values,
# enum_set_string_values, BindVariable, ExecuteOptions.included_fields, Session.options and
# VStreamFlags.tables_to_copy as at v24)
FIELDS = [
    (vtgate_pb2.VStreamRequest, {"caller_id": 1, "tablet_type": 2, "vgtid": 3, "filter": 4, "flags": 5}),
    (vtgate_pb2.VStreamFlags, {"minimize_skew": 1, "heartbeat_interval": 2, "stop_on_reshard": 3, "cells": 4,
                               "cell_preference": 5, "tablet_order": 6, "tables_to_copy": 9}),
    (vtgate_pb2.VStreamResponse, {"events": 1}),
    (binlogdata_pb2.VEvent, {"type": 1, "timestamp": 2, "gtid": 3, "statement": 4, "row_event": 5,
                             "field_event": 6, "vgtid": 7, "journal": 8, "dml": 9, "current_time": 20,
                             "last_p_k_event": 21, "keyspace": 22, "shard": 23, "throttled": 24}),
    (binlogdata_pb2.RowChange, {"before": 1, "after": 2, "data_columns": 3, "json_partial_values": 4}),
    (binlogdata_pb2.RowChange.Bitmap, {"count": 1, "cols": 2}),
    (binlogdata_pb2.RowEvent, {"table_name": 1, "row_changes": 2, "keyspace": 3, "shard": 4, "flags": 5}),
    (binlogdata_pb2.FieldEvent, {"table_name": 1, "fields": 2, "keyspace": 3, "shard": 4,
                                 "enum_set_string_values": 25}),
    (binlogdata_pb2.ShardGtid, {"keyspace": 1, "shard": 2, "gtid": 3, "table_p_ks": 4}),
    (binlogdata_pb2.VGtid, {"shard_gtids": 1}),
    (binlogdata_pb2.TableLastPK, {"table_name": 1, "lastpk": 3}),
    (binlogdata_pb2.LastPKEvent, {"table_last_p_k": 1, "completed": 2}),
    (binlogdata_pb2.Journal, {"id": 1, "migration_type": 2, "tables": 3, "local_position": 4, "shard_gtids": 5,
                              "participants": 6, "source_workflows": 7}),
    (binlogdata_pb2.Rule, {"match": 1, "filter": 2}),
    (binlogdata_pb2.Filter, {"rules": 1, "field_event_mode": 2, "workflow_type": 3, "workflow_name": 4}),
    (binlogdata_pb2.MinimalTable, {"name": 1, "fields": 2, "p_k_columns": 3}),
    (query_pb2.Field, {"name": 1, "type": 2, "table": 3, "org_table": 4, "database": 5, "org_name": 6,
                       "column_length": 7, "charset": 8, "decimals": 9, "flags": 10, "column_type": 11}),
    (query_pb2.Row, {"lengths": 1, "values": 2}),
    (query_pb2.BindVariable, {"type": 1, "value": 2}),
    (query_pb2.BoundQuery, {"sql": 1, "bind_variables": 2}),
    (query_pb2.ExecuteOptions, {"included_fields": 4}),
    (vtgate_pb2.Session, {"autocommit": 4, "target_string": 5, "options": 6}),
    (query_pb2.QueryResult, {"fields": 1, "rows_affected": 2, "insert_id": 3, "rows": 4, "info": 6,
                             "session_state_changes": 7}),
    (vtrpc_pb2.CallerID, {"principal": 1, "component": 2, "subcomponent": 3, "groups": 4}),
]  # fmt: skip


@pytest.mark.parametrize(("message", "numbers"), FIELDS, ids=[m.DESCRIPTOR.full_name for m, _ in FIELDS])
def test_field_numbers(message, numbers):
    assert {f.name: f.number for f in message.DESCRIPTOR.fields} == numbers


def test_enum_values_and_service():
    assert dict(binlogdata_pb2.VEventType.items()) == {
        "UNKNOWN": 0, "GTID": 1, "BEGIN": 2, "COMMIT": 3, "ROLLBACK": 4, "DDL": 5, "INSERT": 6, "REPLACE": 7,
        "UPDATE": 8, "DELETE": 9, "SET": 10, "OTHER": 11, "ROW": 12, "FIELD": 13, "HEARTBEAT": 14, "VGTID": 15,
        "JOURNAL": 16, "VERSION": 17, "LASTPK": 18, "SAVEPOINT": 19, "COPY_COMPLETED": 20,
    }  # fmt: skip
    types = dict(query_pb2.Type.items())
    assert (types["INT64"], types["UINT64"], types["VARBINARY"], types["JSON"], types["DECIMAL"]) == (
        265, 778, 10262, 2078, 18,
    )  # fmt: skip
    assert types["UINT8"] == 770 == query_pb2.ISUNSIGNED | query_pb2.ISINTEGRAL | 2
    assert topodata_pb2.PRIMARY == topodata_pb2.MASTER == 1 and topodata_pb2.RDONLY == 3
    assert vtrpc_pb2.UNAUTHENTICATED == 16
    method = service.DESCRIPTOR.services_by_name["Vitess"].methods_by_name["VStream"]
    assert service.DESCRIPTOR.package == "vtgateservice" and method.server_streaming
    assert (method.input_type.full_name, method.output_type.full_name) == (
        "vtgate.VStreamRequest", "vtgate.VStreamResponse",
    )  # fmt: skip
