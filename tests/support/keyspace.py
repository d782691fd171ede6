"""Key spaces for snapshot completeness tests: key types, their edge values, key shapes, and a
mutator that changes rows while a chunked snapshot is read.

A :class:`KeyType` is a column type and a generator of SQL literals for it (edges first: min/max,
fractional seconds, DST instants, case/accent variants ...).  A :class:`KeyCase` is one table: key
columns (a composite key mixing types), NULL-able columns used through ``message.key.columns``,
and a chunk size.  Composite keys draw their leading columns from a few values only, so chunks end
inside runs of equal leading values.  Literals are SQL text for the server under test, written by
the test modules; duplicates under the server's equality (collations, rounding) are dropped by the
server (``INSERT`` that ignores conflicts), so the generators need not know every collation.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Literals = Callable[[random.Random], list[str]]


@dataclass(frozen=True)
class KeyType:
    """A key column type: ``sql`` its declaration, ``literals(rng)`` distinct-looking SQL literals."""

    name: str
    sql: str
    literals: Literals


@dataclass(frozen=True)
class KeyCase:
    """One table: ``types`` are its key columns in key order; ``nullable`` marks key columns that
    may hold NULL (a unique key given as ``message.key.columns`` instead of a primary key)."""

    id: str
    types: tuple[KeyType, ...]
    chunk: int = 7
    nullable: tuple[bool, ...] = ()
    rows: int = 120
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        return [f"k{i}" for i in range(len(self.types))]

    def is_nullable(self, i: int) -> bool:
        return bool(self.nullable) and self.nullable[i]


def key_tuples(case: KeyCase, count: int, seed: int) -> list[tuple[str, ...]]:
    """``count`` key tuples (SQL literals), shuffled; leading columns repeat in runs."""
    rng = random.Random(seed)
    pools = [t.literals(rng) for t in case.types]
    if len(pools) > 1:  # a few leading values: runs of equal leading keys longer than a chunk
        pools[0] = pools[0][: max(2, min(len(pools[0]), count // (3 * case.chunk) or 2))]
    for i, pool in enumerate(pools):
        if case.is_nullable(i):
            pool.append("NULL")
    seen: set[tuple[str, ...]] = set()
    out: list[tuple[str, ...]] = []
    for _ in range(count * 20):
        if len(out) >= count:
            break
        tup = tuple(rng.choice(p) if j else _lead(rng, p) for j, p in enumerate(pools))
        if tup not in seen:
            seen.add(tup)
            out.append(tup)
    rng.shuffle(out)
    return out


def _lead(rng: random.Random, pool: list[str]) -> str:
    # edges (listed first by every generator) more often than the rest
    return rng.choice(pool[:4]) if rng.random() < 0.3 else rng.choice(pool)


class Mutator:
    """Changes rows of one table through ``execute(sql, params)``: updates of a non-key column,
    deletes, key changes (to unused keys) and inserts.  Rows are addressed by their ``id`` column.

    :param conflict: the driver's exception for a key that already exists (that change is skipped).
    """

    def __init__(
        self,
        execute: Callable[[str, Sequence[Any]], Any],
        table: str,
        columns: Sequence[str],
        live: dict[int, tuple[str, ...]],
        spare: list[tuple[str, ...]],
        conflict: type[BaseException],
        seed: int,
    ) -> None:
        self.execute, self.table, self.columns = execute, table, list(columns)
        self.live, self.spare, self.conflict = live, spare, conflict
        self.rng = random.Random(seed)
        self.next_id = max(live, default=0) + 1
        self.done = 0

    def step(self, count: int = 1) -> None:
        for _ in range(count):
            self._one()

    def _one(self) -> None:
        op = self.rng.random()
        if not self.live and not self.spare:
            return
        if not self.live or (op < 0.25 and self.spare):
            self._insert()
            return
        row_id = self.rng.choice(sorted(self.live))
        try:
            if op < 0.55:
                self.execute(f"UPDATE {self.table} SET v = v + 1 WHERE id = %s", (row_id,))
            elif op < 0.75:
                self.execute(f"DELETE FROM {self.table} WHERE id = %s", (row_id,))
                del self.live[row_id]
            elif self.spare:
                new = self.spare.pop()
                sets = ", ".join(f"{c} = {v}" for c, v in zip(self.columns, new, strict=True))
                self.execute(f"UPDATE {self.table} SET {sets} WHERE id = %s", (row_id,))
                self.live[row_id] = new
        except self.conflict:
            return
        self.done += 1

    def _insert(self) -> None:
        new = self.spare.pop()
        row_id, self.next_id = self.next_id, self.next_id + 1
        try:
            self.execute(insert_sql(self.table, self.columns, [new], row_id), ())
        except self.conflict:
            return
        self.live[row_id] = new
        self.done += 1


def insert_sql(table: str, columns: Sequence[str], keys: Sequence[tuple[str, ...]], first_id: int) -> str:
    """One multi-row ``INSERT`` of ``keys`` with ids from ``first_id`` (payload ``v`` = id)."""
    values = ", ".join(f"({first_id + i}, {first_id + i}, {', '.join(k)})" for i, k in enumerate(keys))
    return f"INSERT INTO {table} (id, v, {', '.join(columns)}) VALUES {values}"


def frac(rng: random.Random, digits: int) -> str:
    """A fractional-seconds suffix with exactly ``digits`` digits ('' for none)."""
    if not digits:
        return ""
    return "." + "".join(rng.choice("0123456789") for _ in range(digits))


def many(rng: random.Random, n: int, make: Callable[[random.Random], str], edges: Sequence[str]) -> list[str]:
    """Edges first, then ``n`` generated values, without repeats (as text)."""
    out = list(dict.fromkeys(edges))
    seen = set(out)
    for _ in range(n * 4):
        if len(out) >= len(edges) + n:
            break
        v = make(rng)
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def case_variants(rng: random.Random, word: str, accents: bool) -> str:
    """``word`` with random case (and, when ``accents``, accented vowels): equal under a case- and
    accent-insensitive collation, different bytes."""
    marks = {"a": "áàâä", "e": "éèêë", "i": "íìîï", "o": "óòôö", "u": "úùûü"}
    out = []
    for ch in word:
        if accents and ch in marks and rng.random() < 0.4:
            ch = rng.choice(marks[ch])
        out.append(ch.upper() if rng.random() < 0.5 else ch)
    return "".join(out)
