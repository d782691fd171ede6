"""``sys.sp_cdc_enable_table`` / ``sys.sp_cdc_disable_table`` for the emulator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg import sql

from airflow_cdc.testing.sqlserver_emulator import catalog as C
from airflow_cdc.testing.sqlserver_emulator.capture import lsn_bytes
from airflow_cdc.testing.sqlserver_emulator.server import SqlError
from airflow_cdc.testing.sqlserver_emulator.types import SqlType

if TYPE_CHECKING:
    from airflow_cdc.testing.sqlserver_emulator.emulator import SqlServerCdcEmulator


def enable_table(
    emu: SqlServerCdcEmulator,
    database: str,
    table: str,
    capture_instance: str | None,
    captured_columns: Sequence[str] | None,
    role_name: str | None,
) -> str:
    schema, _, name = table.rpartition(".")
    schema = schema or "dbo"
    ci = capture_instance or f"{schema}_{name}"
    with emu.pg_connect(database) as conn:
        row = conn.execute(
            "SELECT object_id FROM sys.tables WHERE object_id = object_id(%s)", (f'"{schema}"."{name}"',)
        ).fetchone()
        if row is None:
            raise SqlError(22931, f"Source table '{schema}.{name}' does not exist in the current database.")
        oid = row[0]
        existing = conn.execute(
            "SELECT count(*) FROM cdc.change_tables WHERE source_object_id = %s", (oid,)
        ).fetchone()
        if existing and existing[0] >= 2:
            raise SqlError(22962, f"Two capture instances already exist for source table '{schema}.{name}'.")
        if conn.execute("SELECT 1 FROM cdc.change_tables WHERE capture_instance = %s", (ci,)).fetchone():
            raise SqlError(
                22926,
                f"Could not create a capture instance because the capture instance name "
                f"'{ci}' already exists in the current database.",
            )
        cols = conn.execute(
            "SELECT name, column_id FROM sys.columns WHERE object_id = %s ORDER BY column_id", (oid,)
        ).fetchall()
        chosen = [(c, i) for c, i in cols if captured_columns is None or c in captured_columns]
        types = {c: emu.types.column_type(database, oid, c) for c, _ in chosen}
        ct_cols = C.ct_columns([(c, types[c]) for c, _ in chosen])
        defs = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t.pg_storage)) for c, t in ct_cols]
        ct_name = ci + "_CT"
        conn.execute(
            sql.SQL("CREATE TABLE cdc.{} ({})").format(sql.Identifier(ct_name), sql.SQL(", ").join(defs))
        )
        ct_oid = emu.types.register(conn, database, f'cdc."{ct_name}"', dict(ct_cols))
        if not existing or existing[0] == 0:
            conn.execute(
                sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                    sql.Identifier(schema), sql.Identifier(name)
                )
            )
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE {}.{}").format(
                    sql.Identifier(C.PUBLICATION), sql.Identifier(schema), sql.Identifier(name)
                )
            )
        pk = conn.execute(
            "SELECT a.attname, k.ord, a.attnum FROM pg_index i,"
            " unnest(i.indkey) WITH ORDINALITY AS k(att, ord), pg_attribute a"
            " WHERE i.indrelid = %s::oid AND i.indisprimary AND a.attrelid = i.indrelid"
            " AND a.attnum = k.att ORDER BY k.ord",
            (oid,),
        ).fetchall()
        lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        # start_lsn stays NULL until the capture job's next scan establishes it (Microsoft:
        # "NULL = the low endpoint for this capture instance has not been established");
        # index_name is NULL for a table without a primary key ("NULL = the source table did not
        # have a primary key and a unique index was not specified", cdc.change_tables), whose
        # capture instance has no index columns and supports_net_changes 0 (sys.sp_cdc_enable_table)
        conn.execute(
            "INSERT INTO cdc.change_tables (object_id, source_object_id, capture_instance, start_lsn,"
            " role_name, index_name, create_date) VALUES (%s, %s, %s, NULL, %s, %s, now())",
            (ct_oid, oid, ci, role_name, f"PK_{name}" if pk else None),
        )
        enable_lsn = lsn_bytes(int(lsn[0]) if lsn else 0)
        conn.execute("INSERT INTO cdc.emulator_pending_starts VALUES (%s, %s)", (ci, enable_lsn))
        computed = {
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::oid AND attgenerated <> ''", (oid,)
            ).fetchall()
        }
        for ordinal, (c, col_id) in enumerate(chosen, start=1):
            conn.execute(
                "INSERT INTO cdc.captured_columns VALUES (%s, %s, %s, %s, %s, %s)",
                (ct_oid, c, col_id, _type_name(types[c]), ordinal, 1 if c in computed else 0),
            )
        ids: dict[str, int] = dict(cols)
        for col, ordinal, _ in pk:
            conn.execute(
                "INSERT INTO cdc.index_columns VALUES (%s, %s, %s, %s)", (ct_oid, col, ordinal, ids[col])
            )
        conn.execute("UPDATE sys.tables SET is_tracked_by_cdc = 1 WHERE object_id = %s", (oid,))
    return ci


def _type_name(t: SqlType) -> str:
    return t.name  # captured_columns.column_type holds the bare type name, as SQL Server does


def disable_table(emu: SqlServerCdcEmulator, database: str, table: str, capture_instance: str) -> None:
    schema, _, name = table.rpartition(".")
    schema = schema or "dbo"
    with emu.pg_connect(database) as conn:
        rows = conn.execute(
            "SELECT ct.object_id, ct.capture_instance, ct.source_object_id FROM cdc.change_tables ct"
            " WHERE ct.source_object_id = object_id(%s) AND (%s = 'all' OR ct.capture_instance = %s)",
            (f'"{schema}"."{name}"', capture_instance, capture_instance),
        ).fetchall()
        if not rows:
            raise SqlError(
                22904,
                f"Could not disable change data capture for table '{schema}.{name}': "
                f"capture instance '{capture_instance}' does not exist.",
            )
        for ct_oid, ci, _ in rows:
            conn.execute(sql.SQL("DROP TABLE cdc.{}").format(sql.Identifier(ci + "_CT")))
            conn.execute("DELETE FROM cdc.emulator_pending_starts WHERE capture_instance = %s", (ci,))
            for tbl in ("change_tables", "captured_columns", "index_columns"):
                conn.execute(
                    sql.SQL("DELETE FROM cdc.{} WHERE object_id = %s").format(sql.Identifier(tbl)), (ct_oid,)
                )
        oid = rows[0][2]
        left = conn.execute(
            "SELECT count(*) FROM cdc.change_tables WHERE source_object_id = %s", (oid,)
        ).fetchone()
        if left and left[0] == 0:
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE {}.{}").format(
                    sql.Identifier(C.PUBLICATION), sql.Identifier(schema), sql.Identifier(name)
                )
            )
            conn.execute("UPDATE sys.tables SET is_tracked_by_cdc = 0 WHERE object_id = %s", (oid,))
