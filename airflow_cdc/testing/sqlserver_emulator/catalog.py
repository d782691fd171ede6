"""The emulated database's catalog in PostgreSQL: ``cdc.*`` tables, ``sys.*`` tables and functions.

Every emulated SQL Server database is one PostgreSQL database holding the user tables (schema
``dbo`` and others), SQL Server's CDC tables with their column names (``cdc.change_tables``,
``cdc.captured_columns``, ``cdc.index_columns``, ``cdc.lsn_time_mapping``, one
``cdc.<capture_instance>_CT`` per capture instance), a few ``sys`` tables the emulator keeps up to
date, and PL/pgSQL versions of ``sys.fn_cdc_*`` so translated T-SQL runs unchanged.  Column types
of these tables as SQL Server reports them are in :data:`CATALOG_TYPES`.
"""

from __future__ import annotations

from airflow_cdc.testing.sqlserver_emulator.types import SqlType

ZERO_LSN = b"\x00" * 10
PUBLICATION = "sqlserver_emulator_cdc"

SETUP_DDL = r"""
CREATE SCHEMA IF NOT EXISTS dbo;
CREATE SCHEMA cdc;
CREATE SCHEMA sys;
CREATE TABLE cdc.change_tables (
    object_id int PRIMARY KEY, version int NOT NULL DEFAULT 0, source_object_id int NOT NULL,
    capture_instance text NOT NULL UNIQUE, start_lsn bytea, end_lsn bytea,
    supports_net_changes smallint NOT NULL DEFAULT 0, has_drop_pending smallint,
    role_name text, index_name text, filegroup_name text, create_date timestamp(3) NOT NULL,
    partition_switch smallint NOT NULL DEFAULT 0);
CREATE TABLE cdc.captured_columns (
    object_id int NOT NULL, column_name text NOT NULL, column_id int, column_type text NOT NULL,
    column_ordinal int NOT NULL, is_computed smallint NOT NULL DEFAULT 0);
CREATE TABLE cdc.index_columns (
    object_id int NOT NULL, column_name text NOT NULL, index_ordinal smallint NOT NULL,
    column_id int NOT NULL);
CREATE TABLE cdc.lsn_time_mapping (
    start_lsn bytea PRIMARY KEY, tran_begin_time timestamp(3), tran_end_time timestamp(3),
    tran_id bytea NOT NULL, tran_begin_lsn bytea);
CREATE TABLE sys.databases (
    name text NOT NULL, database_id int NOT NULL, is_cdc_enabled smallint NOT NULL,
    snapshot_isolation_state smallint NOT NULL, is_read_committed_snapshot_on smallint NOT NULL);
CREATE TABLE sys.tables (
    object_id int PRIMARY KEY, name text NOT NULL, schema_id int NOT NULL,
    is_tracked_by_cdc smallint NOT NULL DEFAULT 0);
CREATE TABLE sys.columns (
    object_id int NOT NULL, name text NOT NULL, column_id int NOT NULL, system_type_id smallint,
    user_type_id int, max_length smallint, precision smallint, scale smallint,
    is_nullable smallint NOT NULL, PRIMARY KEY (object_id, column_id));
CREATE TABLE sys.types (name text NOT NULL, system_type_id smallint, user_type_id int PRIMARY KEY);
CREATE TABLE sys.dm_server_services (servicename text, status int, status_desc text);
CREATE TABLE sys.database_permissions (object_name text PRIMARY KEY, denied smallint NOT NULL);
-- T-SQL's MAX/MIN work on binary; PostgreSQL needs aggregates for bytea.
CREATE FUNCTION public.bytea_larger(a bytea, b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT CASE WHEN a >= b THEN a ELSE b END $$;
CREATE FUNCTION public.bytea_smaller(a bytea, b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT CASE WHEN a <= b THEN a ELSE b END $$;
CREATE AGGREGATE public.max(bytea) (sfunc = public.bytea_larger, stype = bytea);
CREATE AGGREGATE public.min(bytea) (sfunc = public.bytea_smaller, stype = bytea);
CREATE VIEW sys.schemas AS SELECT oid::int AS schema_id, nspname::text AS name FROM pg_namespace;

CREATE FUNCTION sys.fn_cdc_get_max_lsn() RETURNS bytea LANGUAGE sql STABLE AS
$$ SELECT COALESCE(max(start_lsn), '\x00000000000000000000'::bytea) FROM cdc.lsn_time_mapping $$;
CREATE FUNCTION sys.fn_cdc_get_min_lsn(ci text) RETURNS bytea LANGUAGE sql STABLE AS
$$ SELECT COALESCE((SELECT start_lsn FROM cdc.change_tables WHERE capture_instance = ci),
                   '\x00000000000000000000'::bytea) $$;
CREATE FUNCTION sys.fn_cdc_add_lsn(lsn bytea, delta int) RETURNS bytea LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE out bytea := lsn; carry int := delta; i int; v int;
BEGIN
  FOR i IN REVERSE length(lsn) - 1 .. 0 LOOP
    v := get_byte(out, i) + carry;
    carry := CASE WHEN v > 255 THEN 1 WHEN v < 0 THEN -1 ELSE 0 END;
    out := set_byte(out, i, (v + 256) % 256);
    EXIT WHEN carry = 0;
  END LOOP;
  RETURN out;
END $$;
CREATE FUNCTION sys.fn_cdc_increment_lsn(lsn bytea) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT sys.fn_cdc_add_lsn(lsn, 1) $$;
CREATE FUNCTION sys.fn_cdc_decrement_lsn(lsn bytea) RETURNS bytea LANGUAGE sql IMMUTABLE AS
$$ SELECT sys.fn_cdc_add_lsn(lsn, -1) $$;
CREATE FUNCTION sys.fn_cdc_map_lsn_to_time(lsn bytea) RETURNS timestamp(3) LANGUAGE sql STABLE AS
$$ SELECT tran_end_time FROM cdc.lsn_time_mapping WHERE start_lsn <= lsn
   ORDER BY start_lsn DESC LIMIT 1 $$;
CREATE FUNCTION sys.fn_cdc_map_time_to_lsn(op text, t timestamp) RETURNS bytea LANGUAGE sql STABLE AS
$$ SELECT CASE lower(op)
     WHEN 'largest less than or equal' THEN
       (SELECT max(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time <= t)
     WHEN 'largest less than' THEN
       (SELECT max(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time < t)
     WHEN 'smallest greater than' THEN
       (SELECT min(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time > t)
     ELSE (SELECT min(start_lsn) FROM cdc.lsn_time_mapping WHERE tran_end_time >= t) END $$;
-- SQL Server's all-changes functions reject a range outside [min lsn of the instance, max lsn].
CREATE FUNCTION sys.fn_cdc_check_range(ci text, lo bytea, hi bytea) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF lo IS NULL OR hi IS NULL OR lo > hi
     OR lo < sys.fn_cdc_get_min_lsn(ci) OR hi > sys.fn_cdc_get_max_lsn() THEN
    RAISE EXCEPTION '313: An insufficient number of arguments were supplied for the procedure '
                    'or function cdc.fn_cdc_get_all_changes_%.', ci;
  END IF;
  RETURN true;
END $$;
CREATE FUNCTION public.object_name(id int) RETURNS text LANGUAGE sql STABLE AS
$$ SELECT relname::text FROM pg_class WHERE oid = id::oid $$;
CREATE FUNCTION public.object_schema_name(id int) RETURNS text LANGUAGE sql STABLE AS
$$ SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE c.oid = id::oid $$;
CREATE FUNCTION public.object_id(name text) RETURNS int LANGUAGE sql STABLE AS
$$ SELECT to_regclass(name)::oid::int $$;
CREATE FUNCTION public.db_name() RETURNS text LANGUAGE sql STABLE AS $$ SELECT current_database()::text $$;
CREATE FUNCTION public.has_perms_by_name(obj text, cls text, perm text) RETURNS int LANGUAGE sql STABLE AS
$$ SELECT CASE WHEN EXISTS (SELECT 1 FROM sys.database_permissions p
                            WHERE lower(p.object_name) = lower(obj) AND p.denied = 1) THEN 0 ELSE 1 END $$;
"""

SYSNAME = SqlType("nvarchar", 128)
BIT = SqlType("bit")
INT = SqlType("int")
LSN = SqlType("binary", 10)

#: SQL Server types of the catalog tables' columns, by (schema, table) -> column -> type.
CATALOG_TYPES: dict[tuple[str, str], dict[str, SqlType]] = {
    ("cdc", "change_tables"): {
        "object_id": INT,
        "version": INT,
        "source_object_id": INT,
        "capture_instance": SYSNAME,
        "start_lsn": LSN,
        "end_lsn": LSN,
        "supports_net_changes": BIT,
        "has_drop_pending": BIT,
        "role_name": SYSNAME,
        "index_name": SYSNAME,
        "filegroup_name": SYSNAME,
        "create_date": SqlType("datetime"),
        "partition_switch": BIT,
    },
    ("cdc", "captured_columns"): {
        "object_id": INT,
        "column_name": SYSNAME,
        "column_id": INT,
        "column_type": SYSNAME,
        "column_ordinal": INT,
        "is_computed": BIT,
    },
    ("cdc", "index_columns"): {
        "object_id": INT,
        "column_name": SYSNAME,
        "index_ordinal": SqlType("tinyint"),
        "column_id": INT,
    },
    ("cdc", "lsn_time_mapping"): {
        "start_lsn": LSN,
        "tran_begin_time": SqlType("datetime"),
        "tran_end_time": SqlType("datetime"),
        "tran_id": SqlType("varbinary", 10),
        "tran_begin_lsn": LSN,
    },
    ("sys", "databases"): {
        "name": SYSNAME,
        "database_id": INT,
        "is_cdc_enabled": BIT,
        "snapshot_isolation_state": SqlType("tinyint"),
        "is_read_committed_snapshot_on": BIT,
    },
    ("sys", "tables"): {"object_id": INT, "name": SYSNAME, "schema_id": INT, "is_tracked_by_cdc": BIT},
    ("sys", "columns"): {
        "object_id": INT,
        "name": SYSNAME,
        "column_id": INT,
        "system_type_id": SqlType("tinyint"),
        "user_type_id": INT,
        "max_length": SqlType("smallint"),
        "precision": SqlType("tinyint"),
        "scale": SqlType("tinyint"),
        "is_nullable": BIT,
    },
    ("sys", "types"): {"name": SYSNAME, "system_type_id": SqlType("tinyint"), "user_type_id": INT},
    ("sys", "dm_server_services"): {
        "servicename": SqlType("nvarchar", 256),
        "status": INT,
        "status_desc": SqlType("nvarchar", 256),
    },
}

#: SQL Server's system type ids (sys.types.system_type_id == user_type_id for built-in types).
TYPE_IDS = {
    "image": 34,
    "text": 35,
    "uniqueidentifier": 36,
    "date": 40,
    "time": 41,
    "datetime2": 42,
    "datetimeoffset": 43,
    "tinyint": 48,
    "smallint": 52,
    "int": 56,
    "smalldatetime": 58,
    "real": 59,
    "money": 60,
    "datetime": 61,
    "float": 62,
    "ntext": 99,
    "bit": 104,
    "decimal": 106,
    "numeric": 108,
    "smallmoney": 122,
    "bigint": 127,
    "varbinary": 165,
    "varchar": 167,
    "binary": 173,
    "char": 175,
    "nvarchar": 231,
    "nchar": 239,
}

#: Result columns computed by a function (no table origin) whose SQL Server type we know by name.
FUNCTION_TYPES: dict[str, SqlType] = {
    "fn_cdc_get_max_lsn": LSN,
    "fn_cdc_get_min_lsn": LSN,
    "fn_cdc_increment_lsn": LSN,
    "fn_cdc_decrement_lsn": LSN,
    "fn_cdc_map_time_to_lsn": LSN,
    "fn_cdc_map_lsn_to_time": SqlType("datetime"),
    "object_name": SYSNAME,
    "object_schema_name": SYSNAME,
    "db_name": SYSNAME,
    "has_perms_by_name": INT,
}


def ct_columns(captured: list[tuple[str, SqlType]]) -> list[tuple[str, SqlType]]:
    """A change table's columns in SQL Server's order: the five ``__$`` columns, captured, command id."""
    head = [
        ("__$start_lsn", LSN),
        ("__$end_lsn", LSN),
        ("__$seqval", LSN),
        ("__$operation", INT),
        ("__$update_mask", SqlType("varbinary", 128)),
    ]
    return head + list(captured) + [("__$command_id", INT)]
