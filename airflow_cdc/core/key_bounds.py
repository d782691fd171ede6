"""Chunk bounds over key columns that may hold NULLs, as the server orders them.

A row comparison ``(a, b) > (x, y)`` is NULL as soon as a NULL takes part, so rows whose key
columns hold NULLs (possible for ``message.key.columns`` naming a NULL-able unique key, or an
ad hoc surrogate key) would silently fall out of every chunk.  These helpers write the
lexicographic comparison out as an OR of ANDs with explicit ``IS NULL`` tests, placing NULLs
where the source's ``ORDER BY`` places them (MySQL: first; PostgreSQL ascending: last), so
chunk ranges, their ``ORDER BY`` and the max-key probe agree for every row.

Each source renders the terms in its own SQL; a term is ``(column index, op)`` with ``op`` one
of ``=``, ``>``, ``<``, ``null``, ``not null``.
"""

from __future__ import annotations

from collections.abc import Sequence

Term = tuple[int, str]
#: An OR of ANDs; an empty OR is false, an empty AND is true.
Dnf = list[list[Term]]


def needs_expansion(values: Sequence[object | None], nullable: Sequence[bool]) -> bool:
    """Whether a plain row comparison could meet a NULL (then use :func:`after` / :func:`upto`)."""
    return any(nullable) or any(v is None for v in values)


def _equal(i: int, value: object | None) -> Term:
    return (i, "null") if value is None else (i, "=")


def _past(i: int, value: object | None, nullable: bool, nulls_first: bool) -> list[Term]:
    """Terms (each alone sufficient) for "column ``i`` sorts after ``value``"."""
    if value is None:
        return [(i, "not null")] if nulls_first else []
    if nullable and not nulls_first:
        return [(i, ">"), (i, "null")]
    return [(i, ">")]


def _before(i: int, value: object | None, nullable: bool, nulls_first: bool) -> list[Term]:
    """Terms (each alone sufficient) for "column ``i`` sorts before ``value``"."""
    if value is None:
        return [] if nulls_first else [(i, "not null")]
    if nullable and nulls_first:
        return [(i, "<"), (i, "null")]
    return [(i, "<")]


def after(values: Sequence[object | None], nullable: Sequence[bool], nulls_first: bool) -> Dnf:
    """Rows whose key sorts strictly after ``values``."""
    out: Dnf = []
    for i, value in enumerate(values):
        prefix = [_equal(j, values[j]) for j in range(i)]
        out += [[*prefix, t] for t in _past(i, value, nullable[i], nulls_first)]
    return out


def upto(values: Sequence[object | None], nullable: Sequence[bool], nulls_first: bool) -> Dnf:
    """Rows whose key sorts at or before ``values``."""
    out: Dnf = []
    for i, value in enumerate(values):
        prefix = [_equal(j, values[j]) for j in range(i)]
        out += [[*prefix, t] for t in _before(i, value, nullable[i], nulls_first)]
    out.append([_equal(j, v) for j, v in enumerate(values)])
    return out
