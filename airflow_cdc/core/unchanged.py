"""``skip.messages.without.change``: drop the updates that change none of the captured columns.

Debezium (``RelationalChangeRecordEmitter.emitUpdateRecord``) skips an update whose after value
equals its before value, both taken over the columns ``column.include.list`` /
``column.exclude.list`` leave; an update without a before image (PostgreSQL without
``REPLICA IDENTITY FULL``) has nothing to compare with and is emitted.  The same rule here, with
values compared *as the source sent them* (text, or the binlog's decoded values), before any
conversion: equal source values always stage as equal values, so every update dropped here is one
Debezium drops too; a conversion that loses detail (``time.precision.mode=connect``) may let through
an update Debezium would drop, never the other way round.

Values the source did not send:

* in the after image (PostgreSQL's unchanged TOAST, a partial row image) the column did not change:
  the server says so, and apply keeps the stored value -- it counts as unchanged;
* in the before image the old value is unknown -- the column counts as changed.

Two places decide, with the same rule: a table sink drops such updates from each piece it writes,
column-wise (:func:`drop_unchanged_rows`, :func:`drop_unchanged_piece`); a source whose per-event
bookkeeping must not see a dropped update (snapshot chunk tracking, transaction orders) asks
:func:`unchanged_row` first and never hands the update over.  An update a source kept is one the
sink keeps too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_cdc.core.config import Property

if TYPE_CHECKING:
    from airflow_cdc.core.table_sink import ColumnarPiece, RowImages

SKIP_PROPERTY = "skip.messages.without.change"


def skip_property(note: str = "") -> Property:
    """The connector's ``skip.messages.without.change`` property (``note``: what differs there)."""
    doc = (
        "Do not emit an update when none of the captured columns (those `column.include.list` / "
        "`column.exclude.list` keep) changed, e.g. one that changed only excluded columns. Values "
        "are compared as the source sent them; a value the source did not send in the new row "
        "image counts as unchanged, one missing from the old image as changed."
    )
    return Property(SKIP_PROPERTY, "bool", False, f"{doc} {note}".strip())


def _same(old: Any, new: Any, unsent: tuple[object, ...]) -> bool:
    """Whether one column's value is the same in the before (``old``) and after (``new``) image."""
    if new is old:
        return True
    if any(new is u for u in unsent):
        return True  # not sent because it did not change
    if any(old is u for u in unsent):
        return False  # the old value is unknown
    return bool(old == new)


def unchanged_row(
    before: Sequence[Any] | None,
    after: Sequence[Any] | None,
    columns: Sequence[int],
    unsent: tuple[object, ...] = (),
) -> bool:
    """Whether an update leaves every captured column as it was (it is then not emitted).

    :param before: the before image as the source sent it; ``None`` (no before image) is never
        unchanged, as in Debezium.
    :param columns: indices of the captured columns in both images.
    :param unsent: the objects that stand for a value not sent (identity, e.g. the unchanged-TOAST
        marker).
    """
    if before is None or after is None:
        return False
    return all(_same(before[i], after[i], unsent) for i in columns)


def values_same(before: Sequence[Any], after: Sequence[Any], unsent: tuple[object, ...] = ()) -> pa.Array:
    """Per row, whether one column's decoded values (not text) are the same: :func:`unchanged_row`'s
    rule value by value (sources whose codecs take Python values)."""
    return pa.array([_same(b, a, unsent) for b, a in zip(before, after, strict=True)], pa.bool_())


def column_same(
    before: pa.Array,
    after: pa.Array,
    before_unsent: pa.Array | None = None,
    after_unsent: pa.Array | None = None,
) -> pa.Array:
    """Per row, whether one column's value is the same in both images (NULL and NULL are), with the
    masks of values not sent (see the module docstring); :func:`unchanged_row`'s rule column-wise."""
    try:
        equal = pc.equal(before, after)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested types have no compare kernel
        equal = pa.array([b == a for b, a in zip(before.to_pylist(), after.to_pylist(), strict=True)])
    same = pc.or_(pc.fill_null(equal, False), pc.and_(before.is_null(), after.is_null()))
    if before_unsent is not None:
        same = pc.and_(same, pc.invert(before_unsent))
    if after_unsent is not None:
        same = pc.or_(same, after_unsent)
    return same


def _all(columns: list[pa.Array]) -> pa.Array | None:
    out = None
    for same in columns:
        out = same if out is None else pc.and_(out, same)
    return out


def drop_unchanged_rows(
    rows: list[tuple],
    transpose: Callable[[list[tuple | None]], dict[int, list]],
    select: Sequence[int],
    native: Sequence[bool],
    to_text: Callable[[Sequence[Any]], tuple[pa.Array, list[bool] | None]],
    unsent: tuple[object, ...],
) -> list[tuple]:
    """``rows`` (a table sink's buffered ``(op, before, after, ...)`` events) without the unchanged
    updates, in order.

    :param transpose: the sink's column transposition (selected column index -> values).
    :param native: per selected column, whether its codec takes Python values (compared as such)
        rather than text (compared as Arrow strings).
    :param to_text: the sink's text conversion: (string array, not-sent mask or None).
    """
    updates = [i for i, r in enumerate(rows) if r[0] == "u" and r[1] is not None and r[2] is not None]
    if not updates:
        return rows
    befores, afters = transpose([rows[i][1] for i in updates]), transpose([rows[i][2] for i in updates])
    same = []
    for idx, values in zip(select, native, strict=True):
        if values:
            same.append(values_same(befores[idx], afters[idx], unsent))
            continue
        (old, old_unsent), (new, new_unsent) = to_text(befores[idx]), to_text(afters[idx])
        same.append(column_same(old, new, _mask(old_unsent), _mask(new_unsent)))
    unchanged = _all(same)
    if unchanged is None or not pc.any(unchanged).as_py():
        return rows
    dropped = {updates[i] for i, flag in enumerate(unchanged.to_pylist()) if flag}
    return [r for i, r in enumerate(rows) if i not in dropped]


def _mask(flags: list[bool] | None) -> pa.Array | None:
    return None if flags is None else pa.array(flags, pa.bool_())


def drop_unchanged_piece(piece: ColumnarPiece) -> ColumnarPiece | None:
    """The piece without its unchanged updates (the piece itself when it has none); ``None`` when
    nothing is left.  Compares the images' arrays as handed over (source text)."""
    before, after = piece.before, piece.after
    same = _all(
        [
            column_same(b, a, bu, au)
            for b, a, bu, au in zip(before.texts, after.texts, before.unchanged, after.unchanged, strict=True)
        ]
    )
    if same is None:
        return piece
    candidates = pc.and_(pc.equal(piece.ops, "u"), pc.and_(before.present, after.present))
    drop = pc.and_(candidates, same)
    dropped = pc.sum(drop.cast(pa.int64())).as_py() or 0
    if not dropped:
        return piece
    if dropped == len(piece.ops):
        return None
    keep = pc.invert(drop)
    counts = dict(piece.op_counts)
    counts["u"] = counts.get("u", 0) - dropped
    return replace(
        piece,
        ops=piece.ops.filter(keep),
        op_counts={op: n for op, n in counts.items() if n},
        positions=piece.positions.filter(keep),
        source={name: values.filter(keep) for name, values in piece.source.items()},
        before=_kept(before, keep),
        after=_kept(after, keep),
    )


def _kept(image: RowImages, keep: pa.Array) -> RowImages:
    return replace(
        image,
        present=image.present.filter(keep),
        texts=[t.filter(keep) for t in image.texts],
        unchanged=[None if u is None else u.filter(keep) for u in image.unchanged],
    )
