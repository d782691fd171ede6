"""SQL text of the PostgreSQL source.  Identifiers always go through ``psycopg.sql.Identifier``;
values are bound parameters, or ``sql.Literal`` inside ``COPY``, which cannot take parameters."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from airflow_cdc.core import key_bounds
from airflow_cdc.core.conditions import Piece

#: Session settings that fix the text output of every type, so snapshot (COPY) and streaming
#: (pgoutput text tuples, produced by output functions in this same session) agree byte for byte.
SESSION_OPTIONS = (
    "-c DateStyle=ISO,MDY -c IntervalStyle=postgres -c TimeZone=UTC "
    "-c extra_float_digits=1 -c bytea_output=hex -c client_encoding=UTF8"
)

SERVER_CHECKS = """
SELECT current_setting('wal_level'), current_setting('server_version_num')::int,
       r.rolreplication, r.rolsuper, current_user, current_database()
FROM pg_roles r WHERE r.rolname = current_user
"""

def slot_info_query(version_num: int) -> str:
    """``pg_replication_slots`` of one slot, with the columns this server has (13: ``wal_status``;
    16: ``conflicting``; 17: ``failover``, ``invalidation_reason``; NULL where absent)."""
    conflicting = "conflicting" if version_num >= 160000 else "NULL::bool"
    failover = "failover" if version_num >= 170000 else "NULL::bool"
    reason = "invalidation_reason" if version_num >= 170000 else "NULL::text"
    columns = f"restart_lsn::text, wal_status, {conflicting}, {failover}, {reason}"
    return (
        "SELECT slot_name, plugin, slot_type, database, active, confirmed_flush_lsn::text, "  # noqa: S608
        + columns
        + " FROM pg_replication_slots WHERE slot_name = %s"
    )


CREATE_SLOT = "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')"
#: (slot_name, plugin, temporary, twophase, failover): PostgreSQL 17+
CREATE_FAILOVER_SLOT = (
    "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)"
)

SLOT_HOLDER = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s"
ADVANCE_SLOT = "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)"

#: On a standby (PostgreSQL 16+ decodes there) the log a slot can read ends at what recovery has
#: replayed: ``pg_current_wal_*`` fail during recovery, ``pg_last_wal_replay_lsn()`` stands in.
REPLAY = "pg_last_wal_replay_lsn()"
HEAD_LSNS = (
    f"SELECT (CASE WHEN pg_is_in_recovery() THEN {REPLAY} ELSE pg_current_wal_flush_lsn() END)::text, "
    f"(CASE WHEN pg_is_in_recovery() THEN {REPLAY} ELSE pg_current_wal_insert_lsn() END)::text"
)

#: Cheap "is there anything past the offset" checks (sensor/trigger); neither decodes on our side.
#: ``wal``: flushed WAL past the offset (any WAL counts: may over-report, never under-reports).
CHANGES_WAL = (
    f"SELECT CASE WHEN pg_is_in_recovery() THEN {REPLAY} ELSE pg_current_wal_flush_lsn() END > %s::pg_lsn"
)
#: ``slot``: the server decodes up to the first transaction with a published change after the offset.
CHANGES_SLOT = (
    "SELECT EXISTS (SELECT 1 FROM pg_logical_slot_peek_binary_changes(%s, NULL, 1, 'proto_version', '1',"
    " 'publication_names', %s) WHERE lsn > %s::pg_lsn)"
)

PUBLICATION_INFO = "SELECT puballtables, pubviaroot FROM pg_publication WHERE pubname = %s"

PUBLICATION_TABLES = "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s"

LIST_TABLES = """
SELECT n.nspname, c.relname, c.oid, c.relkind, c.relreplident, c.relispartition
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp%%'
ORDER BY n.nspname, c.relname
"""

TABLE_COLUMNS = """
SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

PRIMARY_KEY = """
SELECT a.attname FROM pg_index i
JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord
"""

#: the columns of a table's ``REPLICA IDENTITY USING INDEX`` index (unique, NOT NULL: a key)
IDENTITY_INDEX = PRIMARY_KEY.replace("i.indisprimary", "i.indisreplident")

TYPE_INFO = """
SELECT t.oid, t.typname, t.typtype, t.typelem, t.typbasetype, t.typtypmod,
       COALESCE((SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e
                 WHERE e.enumtypid = t.oid), '{}')
FROM pg_type t WHERE t.oid = %s
"""

TABLE_PRIVILEGE = "SELECT has_table_privilege(%s::oid, 'SELECT')"

SNAPSHOT_WATERMARK = "SELECT pg_current_snapshot()::text"

#: Transactions committed in the WAL (so maybe captured by an earlier window) but invisible to every
#: snapshot until a synchronous standby confirms: their backends wait on ``SyncRep``.  pg_xact_status
#: cannot show them (it says "in progress" while the xid is in the proc array), and other roles'
#: wait events need superuser or pg_read_all_stats.
HIDDEN_COMMITS = (
    "SELECT COALESCE(array_agg(backend_xid::text), '{}') FROM pg_stat_activity "
    "WHERE wait_event_type = 'IPC' AND wait_event = 'SyncRep' AND backend_xid IS NOT NULL"
)

SYNC_VISIBILITY_CHECK = (
    "SELECT current_setting('synchronous_standby_names'), pg_has_role('pg_read_all_stats', 'USAGE'), "
    "current_user"
)

#: A chunk's watermark LSN, read after its snapshot: every commit the snapshot sees lies below it.
#: On a standby a commit is visible once its record is replayed, and the replay position moves
#: only after the redo: the received position (at or past every record being replayed) bounds it.
INSERT_LSN = (
    "SELECT (CASE WHEN pg_is_in_recovery() THEN "
    f"GREATEST({REPLAY}, COALESCE(pg_last_wal_receive_lsn(), {REPLAY})) "
    "ELSE pg_current_wal_insert_lsn() END)::text"
)
IN_RECOVERY = "SELECT pg_is_in_recovery(), current_setting('hot_standby_feedback')::bool"
# flush_log: an empty transaction with an xid (an asynchronous commit the WAL writer flushes)
ASSIGN_XID = "SELECT txid_current()"


def qualified(schema: str, table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def peek_changes(
    slot: str, upto_lsn: str, upto_nchanges: int, publication: str, *, messages: bool = True
) -> sql.Composed:
    """The one streamed call that reads a run's change window (never the consuming variant).

    :param messages: ask for logical decoding messages (pgoutput 14+; 13 refuses the option).
    """
    return sql.SQL(
        "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM pg_logical_slot_peek_binary_changes("
        "{slot}, {upto}::pg_lsn, {n}, 'proto_version', '1', 'publication_names', {pub}{messages})"
    ).format(
        messages=sql.SQL(", 'messages', 'true'" if messages else ""),
        slot=sql.Literal(slot),
        upto=sql.Literal(upto_lsn),
        n=sql.Literal(upto_nchanges),
        pub=sql.Literal(quote_publication_name(publication)),
    )


def binary_copy(query: sql.Composable) -> sql.Composed:
    """``COPY (query) TO STDOUT (FORMAT binary)``."""
    return sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(query)


def quote_publication_name(name: str) -> str:
    """pgoutput parses ``publication_names`` as an identifier list: quote the name for it."""
    return '"' + name.replace('"', '""') + '"'


def user_condition(pieces: Sequence[Piece]) -> sql.Composed:
    """An ``additional-conditions`` filter (:func:`airflow_cdc.core.conditions.condition_pieces`),
    parenthesised: columns as ``sql.Identifier``, literals as ``sql.Literal`` (``COPY`` binds no
    parameters), and a raw-SQL condition (opted in) as the operator's own text."""
    parts: list[sql.Composable] = [sql.SQL("(")]
    for kind, item in pieces:
        if kind == "ident":
            parts.append(sql.Identifier(item))
        elif kind == "value":
            parts.append(sql.Literal(item))
        else:
            parts.append(sql.SQL(item))
    parts.append(sql.SQL(")"))
    return sql.Composed(parts)


def key_bound(
    key: Sequence[str], values: Sequence[str | None], nullable: Sequence[bool], op: str
) -> sql.Composable:
    """``key op values`` (``>`` or ``<=``) in the order of ``ORDER BY key`` (ascending, NULLs last).

    Values are literals of unknown type, which PostgreSQL resolves to the key columns' types and
    collations (exact for every type with a btree order: they are the server's own text output).
    A plain row comparison when no NULL can take part (an index range scan); otherwise written
    out with explicit NULL tests, as a row comparison with a NULL is NULL.
    """
    if not key_bounds.needs_expansion(values, nullable):
        return sql.SQL("({}) {} ({})").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in key),
            sql.SQL(op),
            sql.SQL(", ").join(map(sql.Literal, values)),
        )
    dnf = (key_bounds.after if op == ">" else key_bounds.upto)(values, nullable, False)
    ors = []
    for conj in dnf:
        ands = [
            sql.SQL("{} IS {}").format(sql.Identifier(key[i]), sql.SQL(o.upper()))
            if o in ("null", "not null")
            else sql.SQL("{} {} {}").format(sql.Identifier(key[i]), sql.SQL(o), sql.Literal(values[i]))
            for i, o in conj
        ]
        ors.append(sql.SQL("(") + (sql.SQL(" AND ").join(ands) if ands else sql.SQL("TRUE")) + sql.SQL(")"))
    return sql.SQL("(") + (sql.SQL(" OR ").join(ors) if ors else sql.SQL("FALSE")) + sql.SQL(")")


def chunk_copy(
    schema: str,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    after: Sequence[str | None] | None,
    upto: Sequence[str | None] | None,
    condition: Sequence[Piece] | None,
    limit: int | None,
    nullable: Sequence[bool] | None = None,
    fmt: str = "csv",
    relation: sql.Composable | None = None,
) -> sql.Composed:
    """``COPY (SELECT ... ORDER BY key LIMIT n) TO STDOUT (FORMAT fmt)`` for one snapshot chunk.

    Bounds: see :func:`key_bound`.  ``condition``: the ad hoc snapshot's additional condition
    (:func:`user_condition`).  ``limit`` None: no limit.  ``fmt``: ``csv`` or ``text``.
    ``relation``: what is read instead of the table (:func:`override_relation`).
    """
    if fmt not in ("csv", "text"):
        raise ValueError(f"COPY format {fmt!r}: expected 'csv' or 'text'")
    nulls = list(nullable) if nullable is not None else [False] * len(key)
    where: list[sql.Composable] = []
    if after is not None:
        where.append(key_bound(key, after, nulls, ">"))
    if upto is not None:
        where.append(key_bound(key, upto, nulls, "<="))
    if condition:
        where.append(user_condition(condition))
    query = sql.SQL("SELECT {cols} FROM {tbl}{where} ORDER BY {keys}{limit}").format(
        cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        tbl=qualified(schema, table) if relation is None else relation,
        where=(sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where)) if where else sql.SQL(""),
        keys=sql.SQL(", ").join(sql.Identifier(k) for k in key),
        limit=sql.SQL(" LIMIT {}").format(sql.Literal(limit)) if limit is not None else sql.SQL(""),
    )
    return sql.SQL("COPY ({}) TO STDOUT (FORMAT {})").format(query, sql.SQL(fmt))


def key_at(
    schema: str,
    table: str,
    key: Sequence[str],
    after: Sequence[str | None] | None,
    upto: Sequence[str | None],
    condition: Sequence[Piece] | None,
    offset: int,
    nullable: Sequence[bool],
    relation: sql.Composable | None = None,
) -> sql.Composed:
    """The key (as text) ``offset`` rows into the chunk range ``(after, upto]`` (snapshot parts)."""
    where: list[sql.Composable] = [key_bound(key, upto, nullable, "<=")]
    if after is not None:
        where.append(key_bound(key, after, nullable, ">"))
    if condition:
        where.append(user_condition(condition))
    casts = sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(sql.Identifier(k), sql.Identifier(f"__k{i}"))
        for i, k in enumerate(key)
    )
    return sql.SQL("SELECT {casts} FROM {tbl} WHERE {where} ORDER BY {keys} OFFSET {off} LIMIT 1").format(
        casts=casts,
        tbl=qualified(schema, table) if relation is None else relation,
        where=sql.SQL(" AND ").join(where),
        keys=sql.SQL(", ").join(sql.Identifier(k) for k in key),
        off=sql.Literal(offset),
    )


def order_check(schema: str, table: str, column: str) -> sql.Composed:
    """Plans (never runs) an ordered range read on ``column``: fails for types without a btree order."""
    col = sql.Identifier(column)
    return sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE ({}) > ({}) ORDER BY {}").format(
        qualified(schema, table), col, col, col
    )


def max_key(
    schema: str,
    table: str,
    key: Sequence[str],
    condition: Sequence[Piece] | None,
    relation: sql.Composable | None = None,
) -> sql.Composed:
    """The greatest key at snapshot start: chunks stop there; later rows come from the log."""
    desc = sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(k)) for k in key)
    # aliases matter: ORDER BY a bare name would pick the text output column, not the typed one
    casts = sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(sql.Identifier(k), sql.Identifier(f"__k{i}"))
        for i, k in enumerate(key)
    )
    where = sql.SQL(" WHERE ") + user_condition(condition) if condition else sql.SQL("")
    tbl = qualified(schema, table) if relation is None else relation
    return sql.SQL("SELECT {casts} FROM {tbl}{where} ORDER BY {desc} LIMIT 1").format(
        casts=casts, tbl=tbl, where=where, desc=desc
    )


def override_relation(statement: str, columns: Sequence[str], present: set[str]) -> sql.Composable:
    """A ``snapshot.select.statement.overrides`` statement as the derived table snapshot chunks read
    (:mod:`airflow_cdc.core.snapshot_overrides`): every column of the table, NULL for those the
    statement leaves out.  The statement is the operator's own SQL, on lines of its own."""
    inner = sql.SQL("(\n{}\n) AS {}").format(
        sql.SQL(statement),
        sql.Identifier("snapshot_override"),
    )
    if set(columns) <= present:
        return inner
    cols = [
        sql.Identifier(c) if c in present else sql.SQL("NULL AS {}").format(sql.Identifier(c))
        for c in columns
    ]
    return sql.SQL("(SELECT {} FROM {}) AS {}").format(
        sql.SQL(", ").join(cols), inner, sql.Identifier("snapshot_rows")
    )


def describe_statement(statement: str) -> sql.Composed:
    """Plans an override statement as chunks wrap it, reading no row: its result columns."""
    return sql.SQL("SELECT * FROM (\n{}\n) AS {} LIMIT 0").format(
        sql.SQL(statement),
        sql.Identifier("snapshot_override"),
    )
