"""The emulator's type cases (``tests/integration/sqlserver/test_source_types_real_shapes.py``) against a
real SQL Server, in T-SQL: xml, rowversion, alias types, the CLR types and sql_variant -- catalog
shapes, snapshot and stream values, refusals at open -- and what FreeTDS does with a sql_variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import UnsupportedType
from airflow_cdc.core.pipeline import build_config, build_store
from tests.integration.sqlserver.test_source_types_real_shapes import (
    GEOG,
    H1,
    H12,
    POINT,
    XML_IN,
    XML_OUT,
    after_fields,
    staged,
)
from tests.integration.sqlserver_real.harness_real import RealDb
from tests.support.pipeline import run_capture

pytestmark = pytest.mark.integration


def config(db: RealDb, staging: Path, **props: Any) -> dict[str, Any]:
    return {"name": f"types_{db.name}", "connector": "sqlserver", "staging.path": str(staging),
            "snapshot.isolation.mode": "snapshot", **db.server.properties(db.name), **props}  # fmt: skip


def committed_offset(raw: dict[str, Any]) -> Any:
    state = build_store(build_config(raw)).load(raw["name"])
    return None if state is None else state.data


def create(db: RealDb, ddl: str, table: str, *writes: str) -> None:
    """Create ``dbo.<table>``, enable CDC on it, run ``writes`` and one capture scan."""
    db.server.execute(db.name, ddl)
    db.server.enable_table(db.name, "dbo", table)
    for statement in writes:
        db.server.execute(db.name, statement)
    db.server.run_capture_job(db.name)


def write(db: RealDb, *statements: str) -> None:
    for statement in statements:
        db.server.execute(db.name, statement)
    db.server.run_capture_job(db.name)


def rowversion(db: RealDb, table: str, key: int) -> bytes:
    conn = db.server.connect(db.name)
    try:
        return bytes(conn.cursor().execute(f"SELECT rv FROM dbo.{table} WHERE id = ?", key).fetchone()[0])  # noqa: S608
    finally:
        conn.close()


SHAPES = ("CREATE TABLE dbo.shapes (id int PRIMARY KEY, doc xml NULL, rv rowversion, phone dbo.Phone NULL,"
          " qty dbo.Qty NULL)")  # fmt: skip
PLACES = "CREATE TABLE dbo.places (id int PRIMARY KEY, node hierarchyid NULL, g geometry NULL, geo geography NULL)"
PLACES_ROWS = ("INSERT INTO dbo.places VALUES (1, hierarchyid::Parse('/1/'), geometry::STGeomFromText('POINT (1 2)',"
               " 4326), geography::Point(50, 2, 4326)), (2, hierarchyid::Parse('/1/2/'), NULL, NULL)")  # fmt: skip


def _types(db: RealDb) -> None:
    db.server.execute(db.name, "CREATE TYPE dbo.Phone FROM nvarchar(20) NULL", "CREATE TYPE dbo.Qty FROM int NULL")


def test_catalog_lists_alias_and_clr_types(real_db: RealDb) -> None:
    _types(real_db)
    real_db.server.execute(real_db.name, SHAPES, PLACES.replace("places", "clr"))
    conn = real_db.server.connect(real_db.name)
    try:
        rows = conn.cursor().execute(
            "SELECT c.name, c.system_type_id, c.user_type_id, ty.name, ty.is_user_defined, ty.is_assembly_type"
            " FROM sys.columns c JOIN sys.types ty ON ty.user_type_id = c.user_type_id"
            " WHERE c.object_id IN (OBJECT_ID('dbo.shapes'), OBJECT_ID('dbo.clr'))"
        ).fetchall()
    finally:
        conn.close()
    got = {r[0]: tuple(r[1:]) for r in rows}
    assert got["doc"] == (241, 241, "xml", False, False)
    assert got["rv"] == (189, 189, "timestamp", False, False)
    assert got["phone"][0] == 231 and got["phone"][1] >= 257 and got["phone"][2:] == ("Phone", True, False)
    assert got["qty"][0] == 56 and got["qty"][1] >= 257 and got["qty"][2:] == ("Qty", True, False)
    assert got["node"] == (240, 128, "hierarchyid", False, True)
    assert got["g"] == (240, 130, "geometry", False, True) and got["geo"] == (240, 129, "geography", False, True)


def test_xml_rowversion_and_alias_types_snapshot_and_stream(real_db: RealDb, tmp_path: Path) -> None:
    _types(real_db)
    xml = XML_IN.replace("'", "''")
    create(real_db, SHAPES, "shapes", f"INSERT INTO dbo.shapes (id, doc, phone, qty) VALUES (1, N'{xml}', N'+49 30 1234', 5)")
    raw = config(real_db, tmp_path)
    run_capture(raw)
    stamps = [rowversion(real_db, "shapes", 1)]
    write(real_db, "INSERT INTO dbo.shapes (id, doc, phone, qty) VALUES (2, N'<a/>', N'x', -1)")
    write(real_db, "UPDATE dbo.shapes SET doc = N'<b>1</b>', qty = qty + 1 WHERE id = 1")
    stamps.append(rowversion(real_db, "shapes", 1))
    write(real_db, "UPDATE dbo.shapes SET qty = qty + 1, doc = N'<b>2</b>' WHERE id = 1")
    stamps.append(rowversion(real_db, "shapes", 1))
    write(real_db, "DELETE FROM dbo.shapes WHERE id = 2")
    run_capture(raw)
    events = staged(tmp_path, raw["name"])
    assert [(e["op"], (e["after"] or e["before"])["id"]) for e in events] == [
        ("r", 1), ("c", 2), ("u", 1), ("u", 1), ("d", 2)]
    snap, ins, up1, up2, dele = events
    assert snap["after"] == {"id": 1, "doc": XML_OUT, "rv": stamps[0], "phone": "+49 30 1234", "qty": 5}
    assert ins["after"]["doc"] == "<a />" and (ins["after"]["phone"], ins["after"]["qty"]) == ("x", -1)
    assert (up1["before"]["rv"], up1["after"]["rv"], up2["after"]["rv"]) == tuple(stamps)
    assert len(set(stamps)) == 3 and all(len(s) == 8 for s in stamps) and stamps == sorted(stamps)
    assert (up1["before"]["doc"], up1["after"]["doc"], up2["after"]["doc"]) == (XML_OUT, "<b>1</b>", "<b>2</b>")
    assert (up1["after"]["qty"], up2["after"]["qty"]) == (6, 7)
    assert dele["before"]["rv"] == ins["after"]["rv"] and dele["after"] is None
    fields = after_fields(tmp_path, raw["name"])
    assert fields["doc"][b"connect.name"] == b"io.debezium.data.Xml"
    assert (fields["rv"][b"connect.type"], fields["phone"][b"connect.type"], fields["qty"][b"connect.type"]) == (
        b"bytes", b"string", b"int32")


@pytest.mark.parametrize("column,type_name", [("node", "hierarchyid"), ("g", "geometry"), ("geo", "geography")])
def test_clr_types_are_refused_at_open(real_db: RealDb, tmp_path: Path, column: str, type_name: str) -> None:
    create(real_db, PLACES, "places", PLACES_ROWS)
    others = ",".join(f"dbo.places.{c}" for c in ("node", "g", "geo") if c != column)
    raw = config(real_db, tmp_path, **{"column.exclude.list": others})
    with pytest.raises(UnsupportedType) as err:
        run_capture(raw)
    assert f"column {real_db.name}.dbo.places.{column} has SQL Server type '{type_name}'" in str(err.value)
    assert err.value.hint == f"add dbo.places.{column} to column.exclude.list"
    assert list_batches(str(tmp_path), raw["name"]) == [] and committed_offset(raw) is None


def test_include_unknown_datatypes_stages_clr_serialisations(real_db: RealDb, tmp_path: Path) -> None:
    create(real_db, PLACES, "places", PLACES_ROWS)
    raw = config(real_db, tmp_path, **{"include.unknown.datatypes": True})
    run_capture(raw)
    write(real_db, "INSERT INTO dbo.places VALUES (3, hierarchyid::Parse('/2/'),"
                   " geometry::STGeomFromText('POINT (1 2)', 4326), NULL)",
          "UPDATE dbo.places SET g = geometry::STGeomFromText('POINT (1 2)', 4326),"
          " geo = geography::Point(50, 2, 4326) WHERE id = 2",
          "DELETE FROM dbo.places WHERE id = 1")  # fmt: skip
    run_capture(raw)
    cols = ("id", "node", "g", "geo")
    got = [(e["op"], None if e["before"] is None else tuple(e["before"][c] for c in cols),
            None if e["after"] is None else tuple(e["after"][c] for c in cols)) for e in staged(tmp_path, raw["name"])]
    assert got == [
        ("r", None, (1, H1, POINT, GEOG)),
        ("r", None, (2, H12, None, None)),
        ("c", None, (3, bytes.fromhex("68"), POINT, None)),
        ("u", (2, H12, None, None), (2, H12, POINT, GEOG)),
        ("d", (1, H1, POINT, GEOG), None),
    ]


def test_hierarchyid_key_is_refused_then_chunked_with_include_unknown_datatypes(real_db: RealDb, tmp_path: Path) -> None:
    create(real_db, "CREATE TABLE dbo.tree (node hierarchyid PRIMARY KEY, name nvarchar(10))", "tree",
           "INSERT INTO dbo.tree VALUES (hierarchyid::Parse('/1/2/'), N'b'), (hierarchyid::Parse('/1/'), N'a'),"
           " (hierarchyid::GetRoot(), N'root')")  # fmt: skip
    raw = config(real_db, tmp_path)
    with pytest.raises(UnsupportedType) as err:
        run_capture(raw)
    assert err.value.hint == "set include.unknown.datatypes=true (a key column cannot be excluded)"
    raw = config(real_db, tmp_path, **{"include.unknown.datatypes": True, "incremental.snapshot.chunk.size": 1})
    run_capture(raw)
    write(real_db, "UPDATE dbo.tree SET name = N'c' WHERE node = hierarchyid::Parse('/1/2/')")
    run_capture(raw)
    got = [(e["op"], e["after"]["node"], e["after"]["name"]) for e in staged(tmp_path, raw["name"])]
    assert got == [("r", b"", "root"), ("r", H1, "a"), ("r", H12, "b"), ("u", H12, "c")]


@pytest.mark.parametrize("props", [{}, {"column.exclude.list": "dbo.var.v"}, {"include.unknown.datatypes": True}])
def test_sql_variant_is_refused_until_the_capture_instance_leaves_it_out(
        real_db: RealDb, tmp_path: Path, props: dict[str, Any]) -> None:
    create(real_db, "CREATE TABLE dbo.var (id int PRIMARY KEY, v sql_variant NULL)", "var",
           "INSERT INTO dbo.var VALUES (0, CAST(5 AS int)), (1, CAST(N'héllo' AS nvarchar(10))),"
           " (2, CAST(12.34 AS decimal(10,2))), (3, CAST(0x0102 AS varbinary(4))), (99, NULL)")  # fmt: skip
    raw = config(real_db, tmp_path, **props)
    with pytest.raises(UnsupportedType, match="has SQL Server type 'sql_variant'") as err:
        run_capture(raw)
    assert err.value.hint == ("enable CDC on the table again with @captured_column_list leaving out v"
                              " (column.exclude.list still reads it)")
    assert list_batches(str(tmp_path), raw["name"]) == [] and committed_offset(raw) is None
    real_db.server.execute(real_db.name, "EXEC sys.sp_cdc_disable_table @source_schema = N'dbo',"
                                         " @source_name = N'var', @capture_instance = N'all'",
                           "EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'var',"
                           " @role_name = NULL, @captured_column_list = N'id'")  # fmt: skip
    real_db.server.run_capture_job(real_db.name)
    run_capture(raw)
    assert [e["after"] for e in staged(tmp_path, raw["name"])] == [{"id": i} for i in (0, 1, 2, 3, 99)]


def test_sql_variant_through_freetds(real_db: RealDb) -> None:
    """What the emulator reproduces: without SQL_CA_SS_VARIANT_TYPE the fetch fails; read as
    SQL_C_BINARY a value has no base type and a decimal fails with 07006."""
    if "freetds" not in str(real_db.server.options.get("odbc.driver", "FreeTDS")).lower():
        pytest.skip("FreeTDS behaviour")
    real_db.server.execute(real_db.name, "CREATE TABLE dbo.var (id int PRIMARY KEY, v sql_variant NULL)",
                           "INSERT INTO dbo.var VALUES (0, CAST(5 AS int)), (1, CAST(N'hé' AS nvarchar(10))),"
                           " (2, CAST(12.34 AS decimal(10,2)))")  # fmt: skip
    import pyodbc

    conn = real_db.server.connect(real_db.name)
    try:
        with pytest.raises(pyodbc.Error, match="SQLColAttribute"):
            conn.cursor().execute("SELECT v FROM dbo.var WHERE id = 0").fetchall()
        conn.add_output_converter(-150, lambda b: b)
        values = [conn.cursor().execute("SELECT v FROM dbo.var WHERE id = ?", i).fetchall()[0][0] for i in (0, 1)]
        assert values == [(5).to_bytes(4, "little"), "hé".encode("utf-16-le")]
        with pytest.raises(pyodbc.Error, match="07006"):
            conn.cursor().execute("SELECT v FROM dbo.var WHERE id = 2").fetchall()
    finally:
        conn.close()


def test_alias_typed_key_chunks_and_streams(real_db: RealDb, tmp_path: Path) -> None:
    real_db.server.execute(real_db.name, "CREATE TYPE dbo.Code FROM nvarchar(8) NOT NULL",
                           "CREATE SCHEMA sales", "CREATE TYPE sales.Cents FROM bigint NULL")  # fmt: skip
    create(real_db, "CREATE TABLE dbo.codes (code dbo.Code PRIMARY KEY, cents sales.Cents)", "codes",
           "INSERT INTO dbo.codes VALUES (N'b', 2), (N'a', 1), (N'c', 3)")
    raw = config(real_db, tmp_path, **{"incremental.snapshot.chunk.size": 1})
    run_capture(raw)
    write(real_db, "UPDATE dbo.codes SET cents = 20 WHERE code = N'b'")
    run_capture(raw)
    assert [(e["op"], e["after"]) for e in staged(tmp_path, raw["name"])] == [
        ("r", {"code": "a", "cents": 1}), ("r", {"code": "b", "cents": 2}), ("r", {"code": "c", "cents": 3}),
        ("u", {"code": "b", "cents": 20})]


def test_refusal_of_a_new_table_moves_no_offset(real_db: RealDb, tmp_path: Path) -> None:
    create(real_db, "CREATE TABLE dbo.items (id int PRIMARY KEY, v nvarchar(10))", "items")
    raw = config(real_db, tmp_path, **{"snapshot.mode": "no_data"})
    run_capture(raw)
    write(real_db, "INSERT INTO dbo.items VALUES (3, N'y')")
    before, batches = committed_offset(raw), len(list_batches(str(tmp_path), raw["name"]))
    create(real_db, "CREATE TABLE dbo.maps (id int PRIMARY KEY, g geometry NULL)", "maps")
    with pytest.raises(UnsupportedType, match=rf"{real_db.name}\.dbo\.maps\.g has SQL Server type 'geometry'"):
        run_capture(raw)
    assert committed_offset(raw) == before and len(list_batches(str(tmp_path), raw["name"])) == batches
    run_capture(config(real_db, tmp_path, **{"snapshot.mode": "no_data", "column.exclude.list": "dbo.maps.g"}))
    assert [e["after"]["id"] for e in staged(tmp_path, raw["name"])] == [3]
