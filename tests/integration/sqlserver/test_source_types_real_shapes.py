"""Column types in the shapes a real SQL Server gives them, through the source's snapshot and stream:
``xml``, ``timestamp``/``rowversion``, alias types, ``sql_variant`` and the CLR types.

Expected values are Debezium's: xml a string (``io.debezium.data.Xml``) as the server serialises it,
rowversion bytes (``binary(8)``), an alias type its base type's encoding; ``sql_variant`` and the CLR
types have no Debezium mapping, so they are refused when the source opens -- nothing staged, no offset
moved -- unless excluded or ``include.unknown.datatypes`` stages their bytes.  The same cases run
against a real server in ``tests/integration/sqlserver_real/test_types_real_shapes.py``.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import UnsupportedType
from airflow_cdc.core.pipeline import build_store
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator, catalog
from tests.integration.sqlserver.conftest import connect, pyodbc
from tests.integration.sqlserver.test_source_capture import capture, make_config

XML_IN = "<?xml version=\"1.0\"?><order id='7'><item sku=\"a&amp;b\"></item>\n  <note>x &gt; y</note></order>"
XML_OUT = '<order id="7"><item sku="a&amp;b" /><note>x &gt; y</note></order>'  # as SQL Server returns it
# CLR serialisations (what SQL Server stores and sends): hierarchyid '/1/' and '/1/2/';
# geometry::STGeomFromText('POINT (1 2)', 4326): SRID, version 1, flags 0x0C (valid, single point), x, y
H1, H12 = bytes.fromhex("58"), bytes.fromhex("5b40")
POINT = bytes.fromhex("e6100000010c000000000000f03f0000000000000040")
GEOG = bytes.fromhex("e6100000010c00000000000049400000000000000040")  # geography POINT(2 50)


def _variant(spec: str, value: Any) -> str:
    from airflow_cdc.testing.sqlserver_emulator.special_types import variant_literal

    return variant_literal(spec, value)


def staged(staging: Path, name: str) -> list[dict[str, Any]]:
    """Every staged event (snapshot reads too) in position order."""
    rows = []
    for batch in list_batches(str(staging), name):
        for table in batch.tables():
            for part in batch.parts(table):
                rows += pq.read_table(part).to_pylist()
    return sorted(rows, key=lambda r: r["__position"])


def after_fields(staging: Path, name: str) -> dict[str, dict[bytes, bytes]]:
    """Field metadata of the staged ``after`` struct (Connect type and name), by column."""
    part = next(p for b in list_batches(str(staging), name) for t in b.tables() for p in b.parts(t))
    after = pq.read_schema(part).field("after").type
    return {after.field(i).name: dict(after.field(i).metadata or {}) for i in range(after.num_fields)}


def committed_offset(config: Any) -> Any:
    state = build_store(config).load(config["name"])
    return None if state is None else state.data


@pytest.fixture
def shapes(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> str:
    """``dbo.shapes``: xml, rowversion and two alias types, one row before capture starts."""
    emu = sqlserver_emulator
    with emu.pg_connect(mssql_db, autocommit=True) as pg:
        catalog.create_alias_type(pg, "dbo.Phone", "nvarchar(20)")
        catalog.create_alias_type(pg, "dbo.Qty", "int")
    emu.create_table(mssql_db, "dbo.shapes", [("id", "int"), ("doc", "xml"), ("rv", "rowversion"),
                                              ("phone", "dbo.Phone"), ("qty", "Qty")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.shapes")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.shapes (id, doc, phone, qty) VALUES (1, %s, '+49 30 1234', 5)", (XML_IN,))
    emu.run_capture_job(mssql_db)
    return "dbo.shapes"


def _rowversions(emu: SqlServerCdcEmulator, db: str) -> dict[int, bytes]:
    with emu.pg_connect(db) as pg:
        return {r[0]: bytes(r[1]) for r in pg.execute("SELECT id, rv FROM dbo.shapes").fetchall()}


def test_catalog_lists_alias_and_clr_types_like_sql_server(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, shapes: str) -> None:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.clr", [("id", "int"), ("h", "hierarchyid"), ("g", "geometry"),
                                           ("v", "sql_variant")], primary_key=["id"])
    conn = connect(emu, mssql_db, autocommit=True)
    rows = conn.cursor().execute(
        "SELECT c.name, c.system_type_id, c.user_type_id, ty.name, ty.is_user_defined, ty.is_assembly_type"
        " FROM sys.columns c JOIN sys.types ty ON ty.user_type_id = c.user_type_id"
        " WHERE c.object_id IN (OBJECT_ID('dbo.shapes'), OBJECT_ID('dbo.clr')) ORDER BY c.object_id, c.column_id"
    ).fetchall()
    got = {r[0]: tuple(r[1:]) for r in rows}
    assert got["doc"] == (241, 241, "xml", False, False)
    assert got["rv"] == (189, 189, "timestamp", False, False)
    assert got["phone"][0] == 231 and got["phone"][1] >= 257 and got["phone"][2:] == ("Phone", True, False)
    assert got["qty"][0] == 56 and got["qty"][1] >= 257 and got["qty"][2:] == ("Qty", True, False)
    assert got["h"] == (240, 128, "hierarchyid", False, True)
    assert got["g"] == (240, 130, "geometry", False, True)
    assert got["v"] == (98, 98, "sql_variant", False, False)
    conn.close()


def test_sql_variant_is_unreadable_through_freetds_as_on_a_real_server(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> None:
    """pyodbc reads SQL_SS_VARIANT through SQL_CA_SS_VARIANT_TYPE, which FreeTDS lacks: the fetch
    fails.  Read as SQL_C_BINARY instead, values lose their base type and a decimal fails."""
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.var", [("id", "int"), ("v", "sql_variant")], primary_key=["id"])
    with emu.pg_connect(mssql_db) as pg:
        for i, (spec, value) in enumerate([("int", 5), ("nvarchar(10)", "hé"), ("decimal(10,2)", "12.34")]):
            pg.execute("INSERT INTO dbo.var VALUES (%s, %s)", (i, _variant(spec, value)))
    conn = connect(emu, mssql_db, autocommit=True)
    with pytest.raises(pyodbc.Error, match="SQLColAttribute"):
        conn.cursor().execute("SELECT [v] FROM [dbo].[var] WHERE [id] = 0").fetchall()
    conn.add_output_converter(-150, lambda b: b)
    values = [conn.cursor().execute("SELECT [v] FROM [dbo].[var] WHERE [id] = ?", i).fetchall()[0][0]
              for i in (0, 1)]
    assert values == [(5).to_bytes(4, "little"), "hé".encode("utf-16-le")]
    with pytest.raises(pyodbc.Error, match="07006"):
        conn.cursor().execute("SELECT [v] FROM [dbo].[var] WHERE [id] = 2").fetchall()
    conn.close()


def test_xml_rowversion_and_alias_types_snapshot_and_stream(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, shapes: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path)
    capture(config)  # the snapshot of row 1
    stamps = [_rowversions(emu, mssql_db)[1]]
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.shapes (id, doc, phone, qty) VALUES (2, '<a/>', 'x', -1)")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.shapes SET doc = '<b>1</b>', qty = qty + 1 WHERE id = 1")
    stamps.append(_rowversions(emu, mssql_db)[1])
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.shapes SET qty = qty + 1, doc = '<b>2</b>' WHERE id = 1")
    stamps.append(_rowversions(emu, mssql_db)[1])
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("DELETE FROM dbo.shapes WHERE id = 2")
    emu.run_capture_job(mssql_db)
    capture(config)
    events = staged(tmp_path, config["name"])
    assert [(e["op"], (e["after"] or e["before"])["id"]) for e in events] == [
        ("r", 1), ("c", 2), ("u", 1), ("u", 1), ("d", 2)]
    snap, ins, up1, up2, dele = events
    assert snap["after"] == {"id": 1, "doc": XML_OUT, "rv": stamps[0], "phone": "+49 30 1234", "qty": 5}
    assert ins["after"]["doc"] == "<a />" and (ins["after"]["phone"], ins["after"]["qty"]) == ("x", -1)
    assert (up1["before"]["rv"], up1["after"]["rv"]) == (stamps[0], stamps[1])
    assert (up2["before"]["rv"], up2["after"]["rv"]) == (stamps[1], stamps[2])
    assert len(set(stamps)) == 3 and all(len(s) == 8 for s in stamps) and stamps == sorted(stamps)
    assert (up1["before"]["doc"], up1["after"]["doc"], up2["after"]["doc"]) == (XML_OUT, "<b>1</b>", "<b>2</b>")
    assert (up1["after"]["qty"], up2["after"]["qty"]) == (6, 7)
    assert dele["before"]["rv"] == ins["after"]["rv"] and dele["after"] is None  # row 2: never updated
    fields = after_fields(tmp_path, config["name"])
    assert fields["doc"][b"connect.name"] == b"io.debezium.data.Xml"
    assert (fields["doc"][b"connect.type"], fields["rv"][b"connect.type"]) == (b"string", b"bytes")
    assert (fields["phone"][b"connect.type"], fields["qty"][b"connect.type"]) == (b"string", b"int32")
    assert (fields["phone"][b"sqlserver.type"], fields["qty"][b"sqlserver.type"]) == (b"nvarchar", b"int")


def test_rowversion_in_hex_binary_mode(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, shapes: str, tmp_path: Path) -> None:
    config = make_config(sqlserver_emulator, mssql_db, tmp_path, **{"binary.handling.mode": "hex"})
    capture(config)
    (snap,) = staged(tmp_path, config["name"])
    assert snap["after"]["rv"] == _rowversions(sqlserver_emulator, mssql_db)[1].hex()


@pytest.fixture
def clr(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> str:
    """``dbo.places`` (hierarchyid, geometry and geography columns, two rows) and ``dbo.tree`` (a
    hierarchyid key, three rows)."""
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.places", [("id", "int"), ("node", "hierarchyid"), ("g", "geometry"),
                                              ("geo", "geography")], primary_key=["id"])
    emu.create_table(mssql_db, "dbo.tree", [("node", "hierarchyid"), ("name", "nvarchar(10)")], primary_key=["node"])
    emu.enable_table(mssql_db, "dbo.places")
    emu.enable_table(mssql_db, "dbo.tree")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.places VALUES (1, %s, %s, %s), (2, %s, NULL, NULL)", (H1, POINT, GEOG, H12))
        pg.execute("INSERT INTO dbo.tree VALUES (%s, 'b'), (%s, 'a'), ('\\x'::bytea, 'root')", (H12, H1))
    emu.run_capture_job(mssql_db)
    return "dbo.places"


@pytest.fixture
def variants(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str) -> str:
    """``dbo.var``: a sql_variant column holding several base types."""
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.var", [("id", "int"), ("v", "sql_variant")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.var")
    held = [("int", 5), ("nvarchar(10)", "héllo"), ("decimal(10,2)", Decimal("12.34")),
            ("datetime2(7)", "2020-01-02 03:04:05.1234567"), ("varbinary(4)", b"\x01\x02"), ("bit", 1)]
    with emu.pg_connect(mssql_db) as pg:
        for i, (spec, value) in enumerate(held):
            pg.execute("INSERT INTO dbo.var VALUES (%s, %s)", (i, _variant(spec, value)))
        pg.execute("INSERT INTO dbo.var VALUES (99, NULL)")
    emu.run_capture_job(mssql_db)
    return "dbo.var"


@pytest.mark.parametrize("column,type_name", [("node", "hierarchyid"), ("g", "geometry"), ("geo", "geography")])
def test_clr_types_are_refused_at_open_naming_the_column(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, clr: str, tmp_path: Path,
        column: str, type_name: str) -> None:
    others = ",".join(f"dbo.places.{c}" for c in ("node", "g", "geo") if c != column)
    config = make_config(sqlserver_emulator, mssql_db, tmp_path, **{"column.exclude.list": others,
                                                                     "table.include.list": "dbo.places"})
    with pytest.raises(UnsupportedType) as err:
        capture(config)
    assert f"column {mssql_db}.dbo.places.{column} has SQL Server type '{type_name}'" in str(err.value)
    assert "include.unknown.datatypes=true stages its CLR serialisation" in str(err.value)
    assert err.value.hint == f"add dbo.places.{column} to column.exclude.list"
    assert list_batches(str(tmp_path), config["name"]) == [] and committed_offset(config) is None


def test_unmapped_key_column_is_refused_with_the_key_hint(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, clr: str, tmp_path: Path) -> None:
    config = make_config(sqlserver_emulator, mssql_db, tmp_path, **{"table.include.list": "dbo.tree"})
    with pytest.raises(UnsupportedType, match=rf"column {mssql_db}\.dbo\.tree\.node has SQL Server type 'hierarchyid'") as err:
        capture(config)
    assert err.value.hint == "set include.unknown.datatypes=true (a key column cannot be excluded)"
    assert list_batches(str(tmp_path), config["name"]) == [] and committed_offset(config) is None


@pytest.mark.parametrize("props", [{}, {"column.exclude.list": "dbo.var.v"}, {"include.unknown.datatypes": True}])
def test_sql_variant_is_refused_at_open_until_the_capture_instance_leaves_it_out(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, variants: str, tmp_path: Path,
        props: dict[str, Any]) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **props)
    with pytest.raises(UnsupportedType, match=rf"column {mssql_db}\.dbo\.var\.v has SQL Server type 'sql_variant'") as err:
        capture(config)
    assert err.value.hint == ("enable CDC on the table again with @captured_column_list leaving out v"
                              " (column.exclude.list still reads it)")
    assert list_batches(str(tmp_path), config["name"]) == [] and committed_offset(config) is None
    emu.disable_table(mssql_db, "dbo.var")  # the hint's next step
    emu.enable_table(mssql_db, "dbo.var", captured_columns=["id"])
    emu.run_capture_job(mssql_db)
    capture(config)
    assert [e["after"] for e in staged(tmp_path, config["name"])] == [{"id": i} for i in (0, 1, 2, 3, 4, 5, 99)]


def test_refusal_of_a_new_table_moves_no_offset(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, shapes: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data"})
    capture(config)
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.shapes (id, doc, phone, qty) VALUES (3, '<a/>', 'y', 1)")
    emu.run_capture_job(mssql_db)
    before, batches = committed_offset(config), len(list_batches(str(tmp_path), config["name"]))
    emu.create_table(mssql_db, "dbo.maps", [("id", "int"), ("g", "geometry")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.maps")
    emu.run_capture_job(mssql_db)  # the capture instance's start LSN is set by the job's next scan
    with pytest.raises(UnsupportedType, match=rf"{mssql_db}\.dbo\.maps\.g has SQL Server type 'geometry'"):
        capture(config)
    assert committed_offset(config) == before and len(list_batches(str(tmp_path), config["name"])) == batches
    # the hint's next step works
    capture(make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data", "column.exclude.list": "dbo.maps.g"}))
    assert [e["after"]["id"] for e in staged(tmp_path, config["name"])] == [3]


def test_excluded_clr_columns_are_read_but_not_staged(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, clr: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"column.exclude.list": "dbo.places.(node|g|geo)",
                                                      "table.include.list": "dbo.places"})
    capture(config)
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.places SET geo = %s WHERE id = 2", (GEOG,))
    emu.run_capture_job(mssql_db)
    capture(config)
    events = staged(tmp_path, config["name"])
    assert [(e["op"], e["after"]) for e in events] == [("r", {"id": 1}), ("r", {"id": 2}), ("u", {"id": 2})]


@pytest.mark.parametrize("mode", ["bytes", "hex"])
def test_include_unknown_datatypes_stages_clr_serialisations(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, clr: str, tmp_path: Path, mode: str) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"include.unknown.datatypes": True, "binary.handling.mode": mode,
                                                      "table.include.list": "dbo.places"})
    capture(config)
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.places VALUES (3, %s, %s, NULL)", (bytes.fromhex("68"), POINT))
        pg.execute("UPDATE dbo.places SET g = %s, geo = %s WHERE id = 2", (POINT, GEOG))
        pg.execute("DELETE FROM dbo.places WHERE id = 1")
    emu.run_capture_job(mssql_db)
    capture(config)
    expected = [
        ("r", None, (1, H1, POINT, GEOG)),
        ("r", None, (2, H12, None, None)),
        ("c", None, (3, bytes.fromhex("68"), POINT, None)),
        ("u", (2, H12, None, None), (2, H12, POINT, GEOG)),
        ("d", (1, H1, POINT, GEOG), None),
    ]
    cols = ("id", "node", "g", "geo")

    def encoded(values: tuple | None) -> tuple | None:
        if values is None or mode == "bytes":
            return values
        return tuple(v.hex() if isinstance(v, bytes) else v for v in values)

    def image(row: dict[str, Any] | None) -> tuple | None:
        return None if row is None else tuple(row[c] for c in cols)

    got = [(e["op"], image(e["before"]), image(e["after"])) for e in staged(tmp_path, config["name"])]
    assert got == [(op, encoded(b), encoded(a)) for op, b, a in expected]
    fields = after_fields(tmp_path, config["name"])
    connect_type = b"bytes" if mode == "bytes" else b"string"
    assert {c: fields[c][b"connect.type"] for c in cols[1:]} == dict.fromkeys(cols[1:], connect_type)
    assert {c: fields[c].get(b"connect.name") for c in cols[1:]} == dict.fromkeys(cols[1:])


def test_hierarchyid_key_with_include_unknown_datatypes_chunks_and_streams(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, clr: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    config = make_config(emu, mssql_db, tmp_path, **{"include.unknown.datatypes": True, "table.include.list": "dbo.tree",
                                                      "incremental.snapshot.chunk.size": 1})
    capture(config)  # a chunk per row: the hierarchyid key (its bytes) is the chunk cursor
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.tree SET name = 'c' WHERE node = %s", (H12,))
    emu.run_capture_job(mssql_db)
    capture(config)
    got = [(e["op"], (e["after"] or {}).get("node"), (e["after"] or {}).get("name"))
           for e in staged(tmp_path, config["name"])]
    assert got == [("r", b"", "root"), ("r", H1, "a"), ("r", H12, "b"), ("u", H12, "c")]


def test_alias_typed_key_chunks_and_streams(
        sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path) -> None:
    emu = sqlserver_emulator
    with emu.pg_connect(mssql_db, autocommit=True) as pg:
        catalog.create_alias_type(pg, "dbo.Code", "nvarchar(8)")
        catalog.create_alias_type(pg, "sales.Cents", "bigint")
    emu.create_table(mssql_db, "dbo.codes", [("code", "dbo.Code"), ("cents", "sales.Cents")], primary_key=["code"])
    emu.enable_table(mssql_db, "dbo.codes")
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("INSERT INTO dbo.codes VALUES ('b', 2), ('a', 1), ('c', 3)")
    emu.run_capture_job(mssql_db)
    config = make_config(emu, mssql_db, tmp_path, **{"incremental.snapshot.chunk.size": 1})
    capture(config)  # a chunk per row: the alias-typed key is the chunk cursor
    with emu.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.codes SET cents = 20 WHERE code = 'b'")
    emu.run_capture_job(mssql_db)
    capture(config)
    got = [(e["op"], e["after"]) for e in staged(tmp_path, config["name"])]
    assert got == [("r", {"code": "a", "cents": 1}), ("r", {"code": "b", "cents": 2}), ("r", {"code": "c", "cents": 3}),
                   ("u", {"code": "b", "cents": 20})]
    fields = after_fields(tmp_path, config["name"])
    assert (fields["code"][b"connect.type"], fields["cents"][b"connect.type"]) == (b"string", b"int64")
