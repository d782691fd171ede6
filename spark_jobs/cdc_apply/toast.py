"""Resolve unchanged-TOAST columns (listed in ``__unavailable``) before the silver MERGE.

PostgreSQL does not send a TOASTed value an UPDATE left unchanged.  Its right value is the one
the same row had just before the event:

- an earlier action of the same key in the batch, unless a delete of the key lies in between
  (a delete, or a row that moved in from another key, starts the key's history afresh);
- for the ``c`` of a primary-key change (``__old_key`` set), the old key's value just before
  the move: from the batch, or from silver (read only for the batch's old keys);
- otherwise the stored silver row of the key, which the MERGE keeps for listed columns.

Moves can chain (k1 -> k2 -> k3 in one batch), so the two fills alternate until nothing more
resolves (one round per link of the longest chain).  Batches without placeholders skip it all.
"""

from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from .frames import ACTION, OLD_KEY, POSITION, UNAVAILABLE, TableFrame, all_of, quoted

log = logging.getLogger("airflow_cdc.apply")
STORED = "stored"  # pseudo action: a silver row of an old key, at its stored position
MAX_ROUNDS = 64


def fill_unavailable(frame: TableFrame, stored: DataFrame | None = None) -> DataFrame:
    """The batch's actions with every resolvable unchanged-TOAST column filled (see module doc).

    :param stored: the silver table before this batch (``None`` when it has no rows yet).
    Columns that stay listed keep the stored value in the MERGE (same key) or stay as sent.
    """
    actions = frame.actions
    if not frame.toast or actions.where(F.size(UNAVAILABLE) > 0).limit(1).count() == 0:
        return actions
    data = [n for n in frame.columns if n not in frame.keys]
    moves = actions.where(F.col(OLD_KEY).isNotNull() & (F.size(UNAVAILABLE) > 0))
    has_moves = bool(frame.keys) and moves.limit(1).count() > 0
    if has_moves and stored is not None:
        actions = actions.unionByName(_stored_rows(frame, stored, moves, actions.columns))
    left = None
    rounds = 0
    for _ in range(MAX_ROUNDS if has_moves else 0):
        # materialised once: the move fill reads it three times (moves, states, every action)
        actions = _fill_in_key(actions, frame, data, states=True).localCheckpoint(eager=True)
        # materialised row by row (a local checkpoint spills to disk; a DataFrame cache would
        # build columnar batches of 10,000 rows -- of blobs -- in the heap), lineage cut
        actions = _fill_moves(actions, frame, data).localCheckpoint(eager=True)
        rounds += 1
        now = actions.where(F.col(OLD_KEY).isNotNull()).agg(F.sum(F.size(UNAVAILABLE))).collect()[0][0]
        if not now or now == left:
            break
        left = now
    else:
        if has_moves:
            log.warning("unchanged-TOAST fill stopped after %d rounds of key changes", MAX_ROUNDS)
    # the last round's moved rows pass their values on to later actions of their new keys
    out = _fill_in_key(actions, frame, data, states=False).where(F.col(ACTION) != STORED)
    if rounds:
        log.info("unchanged-TOAST fill: %d round(s) along chains of key changes", rounds)
        # materialised, with its lineage cut: the job writes the tombstones and silver tables this
        # was read from before it is used, and Spark recomputes cached plans over a written path
        # -- dropping this batch's own deleted keys' history from the fill
        out = out.localCheckpoint(eager=True)
    return out


def _stored_rows(frame: TableFrame, stored: DataFrame, moves: DataFrame, columns: list[str]) -> DataFrame:
    """Silver rows of the keys rows moved away from, as ``stored`` pseudo actions."""
    old = moves.select(*(F.col(OLD_KEY).getField(k).alias(f"__ok{i}") for i, k in enumerate(frame.keys)))
    match = [stored[quoted(k)].eqNullSafe(old[f"__ok{i}"]) for i, k in enumerate(frame.keys)]
    rows = stored.join(old.distinct(), on=all_of(match), how="left_semi")
    if "__deleted" in stored.columns:  # soft-deleted rows are not live values
        rows = rows.where(~F.coalesce(F.col("__deleted"), F.lit(False)))
    have = set(stored.columns)
    out = []
    for name in columns:
        if name == ACTION:
            value = F.lit(STORED)
        elif name == UNAVAILABLE:  # a stored value still pending (out-of-order apply) is no value
            value = (
                F.coalesce(F.map_keys(F.col("__pending")), F.array().cast("array<string>"))
                if "__pending" in have
                else F.array().cast("array<string>")
            )
        elif name == OLD_KEY:
            value = F.lit(None)
        elif name in have:
            value = F.col(quoted(name))
        else:
            value = F.lit(None)
        kind = frame.columns.get(name)
        out.append((value.cast(kind) if kind is not None else value).alias(name))
    typed = rows.select(*out)
    return typed.select(*(F.col(quoted(c)) for c in columns))


def _mark(name: str, kind: T.DataType) -> Column:
    """Per action: the value it fixes for ``name`` (ok=true), a reset (ok=false), or null (none)."""
    missing = F.array_contains(UNAVAILABLE, name)
    reset = F.struct(F.lit(False).alias("ok"), F.lit(None).cast(kind).alias("v"))
    value = F.struct(F.lit(True).alias("ok"), F.col(quoted(name)).cast(kind).alias("v"))
    return (
        F.when(F.col(ACTION) == "delete", reset)
        .when(~missing, value)
        .when(F.col(OLD_KEY).isNotNull(), reset)  # moved in: nothing earlier of this key applies
    )


def _fill_in_key(actions: DataFrame, frame: TableFrame, data: list[str], states: bool) -> DataFrame:
    """Fill from the key's own earlier actions; each row also gets its ``__st_*`` states (the
    values it leaves behind; for a delete, those just before it), used by :func:`_fill_moves`.

    Every window is computed in one select, so Spark evaluates them in one Window operator over
    one sort (a select per column stacked an operator per window: 20 passes over the batch's
    rows for 10 columns, each pass buffering every row of the key)."""
    order = Window.partitionBy(*(F.col(quoted(k)) for k in frame.keys)).orderBy(POSITION)
    upto = order.rowsBetween(Window.unboundedPreceding, 0)
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    windows: list[Column] = []
    for i, name in enumerate(data):
        mark = _mark(name, frame.columns[name])
        windows.append(F.last(mark, ignorenulls=True).over(upto).alias(f"__kn{i}"))
        if states:
            windows.append(F.last(mark, ignorenulls=True).over(before).alias(f"__left{i}"))
    columns = actions.columns
    actions = actions.select("*", *windows)
    filled: dict[str, Column] = {}
    still: list[Column] = []
    states_of: list[Column] = []
    deleted = F.col(ACTION) == "delete"
    for i, name in enumerate(data):
        missing = F.array_contains(UNAVAILABLE, name)
        found = missing & F.coalesce(F.col(f"__kn{i}").getField("ok"), F.lit(False))
        filled[name] = F.when(found, F.col(f"__kn{i}").getField("v")).otherwise(F.col(quoted(name)))
        still.append(F.when(missing & ~found, F.lit(name)))
        if states:
            state = F.when(deleted, F.col(f"__left{i}")).otherwise(F.col(f"__kn{i}"))
            states_of.append(state.alias(f"__st{i}"))
    filled[UNAVAILABLE] = F.filter(F.array(*still), lambda x: x.isNotNull())
    out = [filled.get(c, F.col(quoted(c))).alias(c) for c in columns]
    return actions.select(*out, *states_of)


def _fill_moves(actions: DataFrame, frame: TableFrame, data: list[str]) -> DataFrame:
    """Fill the unsent columns of key-change ``c`` rows from the old key's state just before them."""
    keys = frame.keys
    moves = actions.where(F.col(OLD_KEY).isNotNull() & (F.size(UNAVAILABLE) > 0)).select(
        F.col(POSITION).alias("__mp"),
        *(F.col(OLD_KEY).getField(k).alias(f"__mk{i}") for i, k in enumerate(keys)),
    )
    states = actions.select(
        *(F.col(quoted(k)).alias(f"__sk{i}") for i, k in enumerate(keys)),
        F.col(POSITION).alias("__sp"),
        F.struct(*(F.col(f"__st{i}").alias(f"s{i}") for i in range(len(data)))).alias("__state"),
    )
    cond = [states[f"__sk{i}"].eqNullSafe(moves[f"__mk{i}"]) for i in range(len(keys))]
    cond.append(states["__sp"] < moves["__mp"])
    found = moves.join(states, on=all_of(cond))
    found = found.groupBy("__mp").agg(F.max_by("__state", "__sp").alias("__from"))
    joined = actions.join(found, actions[POSITION] == found["__mp"], "left")
    is_move = F.col(OLD_KEY).isNotNull() & F.col("__from").isNotNull()
    still: list[Column] = []
    for i, name in enumerate(data):
        missing = F.array_contains(UNAVAILABLE, name)
        source = F.col("__from").getField(f"s{i}")
        hit = is_move & missing & F.coalesce(source.getField("ok"), F.lit(False))
        joined = joined.withColumn(name, F.when(hit, source.getField("v")).otherwise(F.col(quoted(name))))
        still.append(F.when(missing & ~hit, F.lit(name)))
    joined = joined.withColumn(UNAVAILABLE, F.filter(F.array(*still), lambda x: x.isNotNull()))
    return joined.drop("__mp", "__from", *[f"__st{i}" for i in range(len(data))])
