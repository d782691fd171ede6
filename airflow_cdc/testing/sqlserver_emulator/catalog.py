"""The emulated database's catalog in PostgreSQL: ``cdc.*`` tables, ``sys.*`` tables and functions.

Every emulated SQL Server database is one PostgreSQL database holding the user tables (schema
``dbo`` and others), SQL Server's CDC tables with their column names (``cdc.change_tables``,
``cdc.captured_columns``, ``cdc.index_columns``, ``cdc.lsn_time_mapping``, one
``cdc.<capture_instance>_CT`` per capture instance), a few ``sys`` tables the emulator keeps up to
date, and PL/pgSQL versions of ``sys.fn_cdc_*`` so translated T-SQL runs unchanged.  Column types
of these tables as SQL Server reports them are in :data:`CATALOG_TYPES`.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from airflow_cdc.testing.sqlserver_emulator.special_types import register_alias
from airflow_cdc.testing.sqlserver_emulator.types import SqlType, TypeSpecError

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
    snapshot_isolation_state smallint NOT NULL, is_read_committed_snapshot_on smallint NOT NULL,
    delayed_durability smallint NOT NULL DEFAULT 0);
CREATE TABLE sys.tables (
    object_id int PRIMARY KEY, name text NOT NULL, schema_id int NOT NULL,
    is_tracked_by_cdc smallint NOT NULL DEFAULT 0);
CREATE TABLE sys.columns (
    object_id int NOT NULL, name text NOT NULL, column_id int NOT NULL, system_type_id smallint,
    user_type_id int, max_length smallint, precision smallint, scale smallint,
    is_nullable smallint NOT NULL, PRIMARY KEY (object_id, column_id));
CREATE TABLE sys.types (
    name text NOT NULL, system_type_id smallint, user_type_id int PRIMARY KEY, schema_id int,
    max_length smallint, precision smallint NOT NULL DEFAULT 0, scale smallint NOT NULL DEFAULT 0,
    is_nullable smallint NOT NULL DEFAULT 1, is_user_defined smallint NOT NULL DEFAULT 0,
    is_assembly_type smallint NOT NULL DEFAULT 0, is_table_type smallint NOT NULL DEFAULT 0);
-- Built-in types arrive as (name, id, id) rows (TYPE_IDS): complete them as SQL Server lists them.
-- The CLR types share system_type_id 240 under their own user_type_id; built-ins live in sys.
CREATE FUNCTION sys.types_complete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.is_user_defined = 0 THEN
    NEW.schema_id := COALESCE(NEW.schema_id, 'sys'::regnamespace::oid::int);
    IF NEW.name IN ('hierarchyid', 'geometry', 'geography') THEN
      NEW.system_type_id := 240;
      NEW.is_assembly_type := 1;
      NEW.max_length := CASE NEW.name WHEN 'hierarchyid' THEN 892 ELSE -1 END;
    END IF;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER types_complete BEFORE INSERT ON sys.types FOR EACH ROW EXECUTE FUNCTION sys.types_complete();
-- A column's user_type_id names its alias type (the column's storage is the alias's domain,
-- catalog.create_alias_type) and its system_type_id is its type's system type.
CREATE FUNCTION sys.columns_type_ids() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE alias_id int;
BEGIN
  SELECT t.user_type_id INTO alias_id FROM pg_attribute a JOIN pg_type pt ON pt.oid = a.atttypid
    JOIN sys.types t ON t.is_user_defined = 1 AND pt.typname = 'alias:' || t.name
     AND pt.typnamespace::int = t.schema_id
   WHERE a.attrelid = NEW.object_id::oid AND a.attname = NEW.name;
  NEW.user_type_id := COALESCE(alias_id, NEW.user_type_id);
  NEW.system_type_id := COALESCE(
    (SELECT t.system_type_id FROM sys.types t WHERE t.user_type_id = NEW.user_type_id), NEW.system_type_id);
  RETURN NEW;
END $$;
CREATE TRIGGER columns_type_ids BEFORE INSERT ON sys.columns FOR EACH ROW
  EXECUTE FUNCTION sys.columns_type_ids();
-- timestamp (rowversion): every insert and update stamps the row with the next database
-- rowversion (@@DBTS), eight bytes big-endian; a value written explicitly is overwritten.  (Rows
-- already there when a timestamp column is added keep NULL; SQL Server stamps them.)
CREATE SEQUENCE sys.dbts START 2001;
CREATE FUNCTION sys.stamp_rowversion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW := jsonb_populate_record(NEW, jsonb_build_object(
    TG_ARGV[0], '\x' || lpad(to_hex(nextval('sys.dbts')), 16, '0')));
  RETURN NEW;
END $$;
CREATE FUNCTION sys.columns_rowversion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.system_type_id = 189 THEN
    EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE ON %s FOR EACH ROW'
                   ' EXECUTE FUNCTION sys.stamp_rowversion(%L)',
                   'rowversion_' || NEW.name, NEW.object_id::oid::regclass, NEW.name);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER columns_rowversion AFTER INSERT ON sys.columns FOR EACH ROW
  EXECUTE FUNCTION sys.columns_rowversion();
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
$$ SELECT COALESCE((SELECT start_lsn FROM cdc.lsn_time_mapping ORDER BY start_lsn DESC LIMIT 1),
                   '\x00000000000000000000'::bytea) $$;
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
CREATE FUNCTION public.db_id(name text) RETURNS int LANGUAGE sql STABLE AS
$$ SELECT database_id FROM sys.databases WHERE lower(sys.databases.name) = lower(db_id.name) $$;
-- sys.dm_db_log_stats(database_id): log_end_lsn is "the LSN of the last log record in the
-- transaction log", as text xxxxxxxx:xxxxxxxx:xxxx (Microsoft's reference).  The log is the WAL:
-- its insert position is where the next record goes, so one below it is at or above the start of
-- every record written (every commit LSN of a change row) and below every later one; the other
-- columns of the view are not emulated.
CREATE FUNCTION sys.dm_db_log_stats(db int) RETURNS TABLE (database_id int, log_end_lsn text)
LANGUAGE sql VOLATILE AS $$
  SELECT d.database_id, lpad(to_hex((l.v >> 32)::bigint), 8, '0') || ':'
         || lpad(to_hex((l.v & 4294967295)::bigint), 8, '0') || ':0000'
  FROM sys.databases d,
       (SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint - 1 AS v) l
  WHERE db IS NULL OR d.database_id = db $$;
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
        "delayed_durability": SqlType("tinyint"),
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
    ("sys", "types"): {
        "name": SYSNAME,
        "system_type_id": SqlType("tinyint"),
        "user_type_id": INT,
        "schema_id": INT,
        "max_length": SqlType("smallint"),
        "precision": SqlType("tinyint"),
        "scale": SqlType("tinyint"),
        "is_nullable": BIT,
        "is_user_defined": BIT,
        "is_assembly_type": BIT,
        "is_table_type": BIT,
    },
    ("sys", "dm_server_services"): {
        "servicename": SqlType("nvarchar", 256),
        "status": INT,
        "status_desc": SqlType("nvarchar", 256),
    },
}

#: SQL Server's built-in types by ``sys.types.user_type_id`` (equal to ``system_type_id`` except for
#: the CLR types hierarchyid/geography/geometry, whose system_type_id is 240: ``types_complete``).
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
    "sql_variant": 98,
    "ntext": 99,
    "bit": 104,
    "decimal": 106,
    "numeric": 108,
    "smallmoney": 122,
    "bigint": 127,
    "hierarchyid": 128,
    "geography": 129,
    "geometry": 130,
    "varbinary": 165,
    "varchar": 167,
    "binary": 173,
    "char": 175,
    "timestamp": 189,
    "nvarchar": 231,
    "nchar": 239,
    "xml": 241,
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
    """A change table's columns in SQL Server's order: the five ``__$`` columns, captured, command id.

    A captured timestamp (rowversion) column is ``binary(8)`` there (Microsoft: "Timestamp columns are
    defined as binary(8)" in ``cdc.<capture_instance>_CT``): it holds the captured stamps, it does
    not stamp rows itself.
    """
    head = [
        ("__$start_lsn", LSN),
        ("__$end_lsn", LSN),
        ("__$seqval", LSN),
        ("__$operation", INT),
        ("__$update_mask", SqlType("varbinary", 128)),
    ]
    kept = [(c, SqlType("binary", 8) if t.name == "timestamp" else t) for c, t in captured]
    return head + kept + [("__$command_id", INT)]


def create_alias_type(conn: psycopg.Connection, name: str, base_spec: str, nullable: bool = True) -> int:
    """``CREATE TYPE schema.name FROM base_spec`` in the database of ``conn``; return its user_type_id.

    The alias is a PostgreSQL domain (``schema."alias:name"``) over the base type's storage, listed
    in ``sys.types`` with ``is_user_defined = 1`` and a user_type_id from 257 up; columns of it get
    that user_type_id and the base's system_type_id in ``sys.columns``, as on SQL Server.  Afterwards
    :meth:`SqlType.parse` reads ``name`` (also unqualified) as the alias.

    :raises TypeSpecError: the base is not a system type.
    :raises psycopg.errors.DuplicateObject: the type exists in this database (SQL Server: error 219).
    """
    base = SqlType.parse(base_spec)
    if base.alias or base.name in ("timestamp", "xml", "sql_variant", "hierarchyid", "geometry", "geography"):
        raise TypeSpecError(f"an alias type cannot be based on {base_spec!r}")
    schema, _, short = name.replace("[", "").replace("]", "").rpartition(".")
    schema = schema or "dbo"
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(
        sql.SQL("CREATE DOMAIN {}.{} AS {}").format(
            sql.Identifier(schema), sql.Identifier("alias:" + short), sql.SQL(base.pg_storage)
        )
    )
    row = conn.execute(
        "INSERT INTO sys.types (name, system_type_id, user_type_id, schema_id, max_length, precision, scale,"
        " is_nullable, is_user_defined) SELECT %s, %s, GREATEST(256, max(user_type_id)) + 1,"
        " %s::regnamespace::oid::int, %s, %s, %s, %s, 1 FROM sys.types RETURNING user_type_id",
        (short, TYPE_IDS[base.name], schema, base.max_length, base.precision, base.scale, int(nullable)),
    ).fetchone()
    register_alias(f"{schema}.{short}", base)
    return int(row[0]) if row else 0
