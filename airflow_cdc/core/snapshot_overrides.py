"""``snapshot.select.statement.overrides``: a table's own SELECT for its snapshot, still chunked.

Debezium runs such a statement as the table's snapshot query.  Our snapshots are read in key-ordered
chunks across runs, each reconciled with the log by its watermark, so the statement becomes a
derived table and every chunk reads ``SELECT <columns> FROM (<statement>) AS s WHERE <chunk bounds>
ORDER BY <key> LIMIT n``: the chunk bounds, the order and the watermark stay ours.  For that:

* the statement is one ``SELECT`` (``WITH`` ... ``SELECT`` too); a trailing ``ORDER BY`` is dropped
  (chunks are read in key order whatever it says) unless a ``LIMIT``/``TOP``/``OFFSET``/``FETCH``
  makes it choose rows, and so is a trailing ``;``;
* its result columns are columns of the table, by name, each once, and include the key columns
  (unchanged: chunks are bounded, and chunk rows matched with the log, by them); a table column it
  leaves out is snapshotted as NULL, as Debezium does; a table without key columns, whose snapshot
  is read whole (:mod:`airflow_cdc.core.snapshot_whole`), takes no statement;
* each source describes it on the server at start (nothing is read): a statement that fails there
  or breaks these rules is a :class:`ConfigError` naming the table and the property.

Overrides apply to the snapshots ``snapshot.mode`` schedules (initial, ``when_needed``, ``always``,
tables joining the capture) and to blocking snapshots; ad hoc incremental snapshots
(``execute-snapshot`` signals) read the whole table with their ``additional-conditions``, as in
Debezium.  Rows a statement filters out are not in the snapshot: such a row reaches silver when the
log next changes it (an update is applied as an upsert of its new image); one that never changes
again stays out of silver, as it stays out of Debezium's topic.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core.config import ConnectorConfig, Property
from airflow_cdc.core.errors import ConfigError

log = logging.getLogger(__name__)

OVERRIDES = "snapshot.select.statement.overrides"
TEMPLATE = f"{OVERRIDES}.<table>"
#: ``TableSnapshot.origin`` values whose snapshots read the override (not ``adhoc``, nor ``verify``)
ORIGINS = frozenset({"initial", "blocking"})
_EXAMPLE = "`SELECT * FROM customers.orders WHERE delete_flag = 0` (the seed's soft deletes)"


def override_properties(table_form: str) -> tuple[Property, Property]:
    """The two properties, for a connector whose tables are named ``table_form`` (``<schema>.<table>``)."""
    return (
        Property(
            OVERRIDES,
            "list",
            (),
            f"Tables (`{table_form}`) whose snapshot reads the statement of "
            f"`{OVERRIDES}.{table_form}` instead of the whole table, still in key-ordered, "
            "watermarked chunks: the statement is wrapped as a derived table that each chunk bounds "
            "and orders by the key. It must be one SELECT returning columns of the table by name, "
            "the key columns among them (unchanged); columns it leaves out are snapshotted as NULL; "
            "a trailing ORDER BY is dropped. Checked on the server at start. Applies to the "
            "snapshots `snapshot.mode` schedules and to blocking `execute-snapshot` signals "
            "(PostgreSQL, MySQL/MariaDB), not to incremental ones (those take "
            "`additional-conditions`). Rows the statement filters out "
            "reach silver only when a later change of theirs is captured, as in Debezium.",
        ),
        Property(
            TEMPLATE,
            "str",
            None,
            f"The statement the snapshot of table `<table>` (`{table_form}`, listed in `{OVERRIDES}`) "
            f"reads, e.g. {_EXAMPLE}.",
            check=_not_empty,
        ),
    )


def _not_empty(name: str, value: Any) -> None:
    if not str(value or "").strip():
        raise ConfigError(f"property {name!r}: the statement is empty")


def applies(origin: str) -> bool:
    """Whether a snapshot of ``origin`` (``TableSnapshot.origin``) reads a table's override."""
    return origin in ORIGINS


def configured(config: ConnectorConfig) -> dict[str, tuple[str, str]]:
    """The overrides as ``{table as listed: (property name, statement)}``.

    :raises ConfigError: a listed table without its statement property, or a statement property for
        a table that is not listed; the message names the property.
    """
    if OVERRIDES not in config.properties:
        return {}
    listed = list(config[OVERRIDES])
    statements = {name[len(OVERRIDES) + 1 :]: (name, str(v)) for name, v in config.templated(TEMPLATE)}
    missing = [t for t in listed if t not in statements]
    if missing:
        raise ConfigError(
            f"property {OVERRIDES!r} lists {missing[0]!r} but {OVERRIDES + '.' + missing[0]!r} is not set",
            hint=f"set {OVERRIDES}.{missing[0]} to the SELECT statement of that table's snapshot",
        )
    stray = [t for t in statements if t not in listed]
    if stray:
        raise ConfigError(
            f"property {statements[stray[0]][0]!r} is set but {OVERRIDES!r} does not list {stray[0]!r}",
            hint=f"add {stray[0]} to {OVERRIDES} (a comma-separated list of tables)",
        )
    return {t: statements[t] for t in listed}


def lookup(
    overrides: Mapping[str, tuple[str, str]], names: Sequence[str], fold_case: bool
) -> tuple[str, str] | None:
    """The ``(property, statement)`` of the table known by any of ``names`` (its full name first),
    matched exactly, or ignoring case where the server folds names (``fold_case``)."""
    for name in names:
        if name in overrides:
            return overrides[name]
    if fold_case:
        folded = {n.casefold() for n in names}
        for listed, value in overrides.items():
            if listed.casefold() in folded:
                return value
    return None


@dataclass(frozen=True)
class Dialect:
    """What the statement scanner must know of a dialect's lexical rules."""

    quotes: str = "'\""  # quote characters (a doubled one escapes itself)
    brackets: bool = False  # [identifier] (T-SQL)
    backslash: bool = False  # backslash escapes inside quotes (MySQL)
    hash_comments: bool = False  # '#' to the end of the line (MySQL)
    dollar: bool = False  # $tag$ ... $tag$ strings (PostgreSQL)


POSTGRES = Dialect(dollar=True)
MYSQL = Dialect(quotes="'\"`", backslash=True, hash_comments=True)
TSQL = Dialect(brackets=True)

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$#@]*")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_ROW_CHOOSERS = frozenset({"LIMIT", "TOP", "OFFSET", "FETCH"})


class _Incomplete(Exception):
    pass


def _skip_quoted(text: str, i: int, close: str, backslash: bool) -> int:
    """Index after the quoted part that starts at ``i`` and ends with ``close`` (doubled: escaped)."""
    j = i + 1
    while j < len(text):
        ch = text[j]
        if backslash and ch == "\\":
            j += 2
            continue
        if ch == close:
            if text[j + 1 : j + 2] == close:
                j += 2
                continue
            return j + 1
        j += 1
    raise _Incomplete("an unterminated quote")


def _tokens(text: str, dialect: Dialect) -> list[tuple[int, int, str]]:
    """Top-level tokens as ``(start, depth, token)``: upper-cased words, ``(``, ``)``, ``;``, and
    ``.`` for anything else; quotes and comments are skipped."""
    out: list[tuple[int, int, str]] = []
    i, depth, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith("--", i) or (dialect.hash_comments and ch == "#"):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise _Incomplete("an unterminated comment")
            i = end + 2
        elif ch in dialect.quotes:
            out.append((i, depth, "."))
            i = _skip_quoted(text, i, ch, dialect.backslash)
        elif dialect.brackets and ch == "[":
            out.append((i, depth, "."))
            i = _skip_quoted(text, i, "]", False)
        elif dialect.dollar and ch == "$" and (m := _DOLLAR.match(text, i)):
            end = text.find(m.group(0), m.end())
            if end < 0:
                raise _Incomplete("an unterminated $-quoted string")
            out.append((i, depth, "."))
            i = end + len(m.group(0))
        elif ch == "(" or ch == ")":
            depth += 1 if ch == "(" else -1
            if depth < 0:
                raise _Incomplete("an unbalanced ')'")
            out.append((i, depth if ch == ")" else depth - 1, ch))
            i += 1
        elif m := _WORD.match(text, i):
            out.append((i, depth, m.group(0).upper()))
            i = m.end()
        else:
            out.append((i, depth, ";" if ch == ";" else "."))
            i += 1
    if depth:
        raise _Incomplete("an unbalanced '('")
    return out


def wrappable(statement: str, table: str, prop: str, dialect: Dialect) -> str:
    """The statement ready to be wrapped as a derived table: one SELECT, its trailing ``;`` and its
    trailing ``ORDER BY`` (unless a LIMIT/TOP/OFFSET/FETCH chooses rows by it) removed.

    :raises ConfigError: not one complete SELECT statement; names the table and the property.
    """
    where = f"property {prop!r} (snapshot of {table})"
    try:
        tokens = _tokens(statement, dialect)
    except _Incomplete as e:
        raise ConfigError(f"{where}: the statement is not complete ({e})") from None
    cut = len(statement)
    while tokens and tokens[-1][2] == ";":
        cut = tokens.pop()[0]
    if not tokens:
        raise ConfigError(f"{where}: the statement is empty")
    first = next((t for _, _, t in tokens if t != "("), "")
    if first not in ("SELECT", "WITH"):
        raise ConfigError(f"{where}: not a SELECT statement (it starts with {first or '('!r})")
    if any(t == ";" for _, depth, t in tokens if depth == 0):
        raise ConfigError(f"{where}: holds more than one statement")
    top = [(pos, t) for pos, depth, t in tokens if depth == 0]
    order = [k for k in range(len(top) - 1) if top[k][1] == "ORDER" and top[k + 1][1] == "BY"]
    if order and not any(t in _ROW_CHOOSERS for _, t in top):
        cut = top[order[-1]][0]
    # callers wrap the text on lines of its own: a trailing line comment cannot swallow the ")"
    return statement[:cut].rstrip()


def check_columns(
    table: str,
    prop: str,
    result: Sequence[str],
    columns: Sequence[str],
    key: Sequence[str],
    fold_case: bool,
    extra_ok: bool = False,
) -> set[str]:
    """The table columns the statement returns (by their names in the table).

    :param result: the statement's result column names, as the server described them.
    :param fold_case: the server compares column names ignoring case (MySQL, SQL Server).
    :param extra_ok: result columns that are not in ``columns`` are not read (SQL Server: a capture
        instance captures some of the table's columns, and ``SELECT *`` returns all of them).
    :raises ConfigError: a result column that is no column of the table, one returned twice, or a
        key column missing; names the table and the property.
    """
    where = f"property {prop!r} (snapshot of {table})"

    def norm(name: str) -> str:
        return name.casefold() if fold_case else name

    by_name = {norm(c): c for c in columns}
    found: set[str] = set()
    for name in result:
        column = by_name.get(norm(name))
        if column is None and extra_ok:
            continue
        if column is None:
            shown = ", ".join(list(columns)[:30])
            raise ConfigError(
                f"{where}: the statement returns column {name!r}, which is not a column of the table "
                f"(columns: {shown}); results are matched with the table's columns by name"
            )
        if column in found:
            raise ConfigError(f"{where}: the statement returns column {name!r} more than once")
        found.add(column)
    missing = [k for k in key if k not in found]
    if missing:
        raise ConfigError(
            f"{where}: the statement does not return the key column(s) {', '.join(missing)}; "
            "snapshot chunks are bounded and ordered by the key",
            hint="return the key columns unchanged (e.g. SELECT * ... WHERE ...)",
        )
    return found


def statement_failed(table: str, prop: str, detail: str) -> ConfigError:
    """The error for a statement the server refuses to describe (its message in ``detail``)."""
    return ConfigError(f"property {prop!r} (snapshot of {table}): the server refuses the statement: {detail}")


class Overrides:
    """A connector's overrides and, per table, the relation its snapshot chunks read.

    Each table's statement is checked once per :meth:`clear` (a capture run): lexically, then
    described by the source on the server, then its result columns against the table's.
    """

    def __init__(
        self, config: ConnectorConfig, dialect: Dialect, fold_case: bool = False, extra_columns: bool = False
    ) -> None:
        """:param fold_case: names compare ignoring case; ``extra_columns``: see :func:`check_columns`.
        :raises ConfigError: see :func:`configured`."""
        self.statements = configured(config)
        self.dialect, self.fold_case, self.extra_columns = dialect, fold_case, extra_columns
        self._relations: dict[str, Any] = {}

    def clear(self) -> None:
        """Forget the checked relations (table structures may have changed since)."""
        self._relations = {}

    def unused(self, names: Iterable[str]) -> list[str]:
        """The listed tables that match none of ``names`` (the captured tables' names)."""
        known = {n.casefold() if self.fold_case else n for n in names}
        return [t for t in self.statements if (t.casefold() if self.fold_case else t) not in known]

    def check_all(
        self,
        tables: Iterable[str],
        snapshot_relation: Callable[[str], Any],
        names: Callable[[str], Iterable[str]] = lambda table: (table,),
        where: str = "",
    ) -> None:
        """Check every captured table's statement on the server at start-up (``snapshot_relation``:
        the source's per-table check); warn about listed tables that are not captured.

        :param names: the names a table may be listed under (default: its own).
        :param where: what the source captures from, for the warning (a SQL Server database).
        :raises ConfigError: a statement breaks chunking.
        """
        self.clear()
        if not self.statements:
            return
        captured = list(tables)
        unused = self.unused(n for t in captured for n in names(t))
        if unused:
            log.warning(
                "%s: %s not captured%s; not used", OVERRIDES, ", ".join(unused), where and f" in {where}"
            )
        for table in captured:
            snapshot_relation(table)

    def relation(
        self,
        table: str,
        names: Sequence[str],
        columns: Sequence[str],
        key: Sequence[str],
        describe: Callable[[str, str, str], Sequence[str]],
        build: Callable[[str, set[str]], Any],
    ) -> Any | None:
        """The relation a snapshot of ``table`` reads instead of the table (None: no override).

        :param names: the names the table may be listed under, its full name first.
        :param columns: the table's columns, in order; ``key``: its key columns.
        :param describe: ``describe(statement, table, property)``: the statement's result column
            names, from the server; raises :func:`statement_failed` where the server refuses it.
        :param build: ``build(statement, present columns)``: the source's derived table.
        :raises ConfigError: the statement breaks the rules of the module docstring.
        """
        if table in self._relations:
            return self._relations[table]
        found = lookup(self.statements, names, self.fold_case)
        relation = None
        if found is not None:
            prop, statement = found
            if not key:  # read whole (core.snapshot_whole): no chunk to bound, the mirror replaced
                raise ConfigError(
                    f"property {prop!r} (snapshot of {table}): the table has no key columns, so its "
                    "snapshot is read whole, not in chunks, and cannot take a statement",
                    hint="give the table key columns with message.key.columns, or drop its override",
                )
            text = wrappable(statement, table, prop, self.dialect)
            result = describe(text, table, prop)
            present = check_columns(table, prop, result, columns, key, self.fold_case, self.extra_columns)
            relation = build(text, present)
        self._relations[table] = relation
        return relation
