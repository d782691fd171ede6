"""The safe additional-conditions language: what it accepts and how it renders, what it refuses
(injection attempts included) and with which message, and each dialect's rendering."""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from decimal import Decimal

import pytest

from airflow_cdc.core.conditions import (
    LANGUAGE,
    MAX_DEPTH,
    MAX_LITERALS,
    RAW_SQL_PROPERTY,
    condition_pieces,
    parse_condition,
    pieces_to_text,
)
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.signals import check_signals, parse_signal
from airflow_cdc.sources.mysql import sql as mysql_sql
from airflow_cdc.sources.postgres import sql as pg_sql
from airflow_cdc.sources.sqlserver import sql as mssql_sql

TABLE = "public.t"
COLUMNS = ["id", "status", "amount", "flag", "day", "ts", "prénom", 'Weird "col"', "Mixed"]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def render(text: str, columns: list[str] | None = COLUMNS) -> tuple[str, list]:
    return pieces_to_text(parse_condition(text, TABLE, columns).pieces(), _quote, "?")


@pytest.mark.parametrize(
    ("text", "sql", "params"),
    [
        (
            "status = 'it''s' AND id BETWEEN 10 AND 20 OR amount IS NULL",
            '((("status" = ?) AND ("id" BETWEEN ? AND ?)) OR ("amount" IS NULL))',
            ["it's", 10, 20],
        ),
        ("id != 5", '("id" <> ?)', [5]),
        ("id<>5", '("id" <> ?)', [5]),
        ("id >= -5", '("id" >= ?)', [-5]),
        ("id <= +5", '("id" <= ?)', [5]),
        ("amount < 1.5", '("amount" < ?)', [Decimal("1.5")]),
        ("amount > 1e3", '("amount" > ?)', [Decimal("1E+3")]),
        ("amount > .5", '("amount" > ?)', [Decimal("0.5")]),
        ("id = 99999999999999999999", '("id" = ?)', [Decimal("99999999999999999999")]),
        ("NOT (id = 1)", '(NOT ("id" = ?))', [1]),
        ("not not id = 1", '(NOT (NOT ("id" = ?)))', [1]),
        ("id NOT IN (1, 2,3)", '("id" NOT IN (?, ?, ?))', [1, 2, 3]),
        ("id in ('a')", '("id" IN (?))', ["a"]),
        ("id NOT BETWEEN 1 AND 2", '("id" NOT BETWEEN ? AND ?)', [1, 2]),
        ("amount IS NOT NULL", '("amount" IS NOT NULL)', []),
        ("id in (1,2) and not status is null", '(("id" IN (?, ?)) AND (NOT ("status" IS NULL)))', [1, 2]),
        ("flag = TRUE OR flag = false", '(("flag" = ?) OR ("flag" = ?))', [True, False]),
        ("day = DATE '2024-02-29'", '("day" = ?)', [dt.date(2024, 2, 29)]),
        (
            "ts >= timestamp '2024-01-01 10:00:00.123' AND ts < TIMESTAMP '2024-01-02T00:00'",
            '(("ts" >= ?) AND ("ts" < ?))',
            [dt.datetime(2024, 1, 1, 10, 0, 0, 123000), dt.datetime(2024, 1, 2)],
        ),
        ('"Weird ""col""" = 1', '("Weird ""col""" = ?)', [1]),
        ("prénom = 'Zoë 😀 日本'", '("prénom" = ?)', ["Zoë 😀 日本"]),
        ("ID = 1 AND mixed = 2", '(("id" = ?) AND ("Mixed" = ?))', [1, 2]),
        ("(id = 1 OR id = 2) AND status = 'x'", '((("id" = ?) OR ("id" = ?)) AND ("status" = ?))', [1, 2, "x"]),
        ("id = 1 OR id = 2 AND status = 'x'", '(("id" = ?) OR (("id" = ?) AND ("status" = ?)))', [1, 2, "x"]),
        ("\n\tid\n=\t1\n", '("id" = ?)', [1]),
        # what looks like SQL inside a string is only a value
        ("status = '; DROP TABLE x; --'", '("status" = ?)', ["; DROP TABLE x; --"]),
        ("status = 'a'' OR ''1''=''1'", '("status" = ?)', ["a' OR '1'='1"]),
        ("status = '/* x */ \\'", '("status" = ?)', ["/* x */ \\"]),
        ("status = ''", '("status" = ?)', [""]),
        ("status = 'a\"b`c]d'", '("status" = ?)', ['a"b`c]d']),
    ],
)
def test_accepted(text, sql, params):
    assert render(text) == (sql, params)


def test_params_keep_their_types():
    _, params = render("id = 1 AND amount = 1.50 AND flag = TRUE")
    assert [type(p) for p in params] == [int, Decimal, bool] and params[1] == Decimal("1.50")


def test_unknown_columns_are_used_as_written_when_the_source_cannot_tell():
    assert render("Anything = 1", None) == ('("Anything" = ?)', [1])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1=1; DROP TABLE x", "character ';' is not allowed at character 4"),
        ("1=1", "expected a column name, found '1' at character 1"),
        ("id = 1; DROP TABLE x", "character ';' is not allowed at character 7"),
        ("id = 1 OR (SELECT 1)", "SQL keyword SELECT is not allowed"),
        ("id = (SELECT max(id) FROM t)", "expected a literal, found '\\('"),
        ("id IN (SELECT id FROM t)", "expected a literal, found 'SELECT'"),
        ("id = 1 -- comment", "comments are not allowed at character 8"),
        ("id = 1 /* c */", "comments are not allowed"),
        ("id = 1 # c", "character '#' is not allowed"),
        ("id =--1", "comments are not allowed"),
        ("id = 1 OR 1 = 1", "expected a column name, found '1'"),
        ("upper(status) = 'X'", r"function calls \(upper\(...\)\) are not allowed"),
        ("status = upper('x')", "function calls"),
        ("id = amount", r"expected a literal, found 'amount' \(columns compare with literals only\)"),
        ('status = "open"', "columns compare with literals only"),
        ("id + 1 = 2", "expected a comparison .* after column 'id', found '\\+'"),
        ("status LIKE 'a%'", "expected a comparison .* found 'LIKE'"),
        ("id = 0x10", "expected AND, OR or the end, found 'x10'"),
        ("id = 1 UNION SELECT password FROM users", "expected AND, OR or the end, found 'UNION'"),
        ("`id` = 1", "character '`' is not allowed"),
        ("[id] = 1", r"character '\[' is not allowed"),
        ("status = N'x'", "expected a literal, found 'N'"),
        ("status = 'abc", "unterminated string"),
        ('"abc = 1', "unterminated quoted name"),
        ('"" = 1', "unterminated quoted name"),
        ("id = NULL", "NULL is not a value here: use column IS \\[NOT\\] NULL"),
        ("id IN (1, NULL)", "NULL is not a value here"),
        ("id IN ()", "expected a literal, found '\\)'"),
        ("id IN (1,)", "expected a literal"),
        ("id IN 1", "expected '\\(' after IN"),
        ("id BETWEEN 1", "expected AND after BETWEEN's first value, found the end"),
        ("id BETWEEN 1 OR 2", "expected AND after BETWEEN"),
        ("id IS 1", "expected NULL after IS"),
        ("(id = 1", "expected '\\)', found the end"),
        ("id = 1)", "expected AND, OR or the end, found '\\)'"),
        ("id = 1 AND", "expected a column name, found the end"),
        ("id", "expected a comparison"),
        ("", "the condition is empty"),
        ("   ", "the condition is empty"),
        ("nope = 1", "table public.t has no column 'nope' \\(columns: id, status"),
        ('"ID" = 1', "table public.t has no column 'ID'"),
        ("day = DATE '2024-02-30'", "DATE '2024-02-30' is not a valid date"),
        ("day = DATE '24-1-1'", "is not a valid date"),
        ("ts = TIMESTAMP '2024-01-01T10:00:00+02:00'", "no time zone"),
        ("status = 'a\x00b'", "may not contain a NUL"),
        ("status = '\udc00'", "not valid Unicode"),
        ("id \uff1d 1", "character '\uff1d' is not allowed"),
        ("id\u200b= 1", "is not allowed"),
        ("id = @x", "character '@' is not allowed"),
        ("id = $1", "character '\\$' is not allowed"),
        ("id = ?", "character '\\?' is not allowed"),
        ("id = :x", "character ':' is not allowed"),
        ("status = 'x' COLLATE latin1", "expected AND, OR or the end, found 'COLLATE'"),
        ("id = 1 OR id = 2; --", "character ';'"),
        ("id = 1\\", r"character '\\\\' is not allowed"),
        ("AND id = 1", "expected a column name, found 'AND'"),
        ("true", "expected a column name"),
    ],
)
def test_refused(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_condition(text, TABLE, COLUMNS)
    text_of = str(err.value)
    assert text_of.startswith(f"additional-conditions of {TABLE}: ")
    assert err.value.hint == LANGUAGE and RAW_SQL_PROPERTY in text_of  # says how to allow raw SQL


def test_ambiguous_case_insensitive_match_must_be_quoted():
    with pytest.raises(ConfigError, match="column 'Id' is ambiguous \\(id, ID\\): quote it"):
        parse_condition("Id = 1", TABLE, ["id", "ID"])
    assert parse_condition('"ID" = 1', TABLE, ["id", "ID"]).columns() == {"ID"}


def test_limits():
    deep = "(" * (MAX_DEPTH + 5) + "id = 1" + ")" * (MAX_DEPTH + 5)
    with pytest.raises(ConfigError, match="nested deeper than"):
        parse_condition(deep, TABLE, COLUMNS)
    nots = "NOT " * (MAX_DEPTH + 5) + "id = 1"
    with pytest.raises(ConfigError, match="nested deeper than"):
        parse_condition(nots, TABLE, COLUMNS)
    ok = "(" * (MAX_DEPTH - 1) + "id = 1" + ")" * (MAX_DEPTH - 1)
    assert parse_condition(ok, TABLE, COLUMNS).columns() == {"id"}
    many = "id IN (" + ", ".join(str(i) for i in range(MAX_LITERALS + 1)) + ")"
    with pytest.raises(ConfigError, match=f"more than {MAX_LITERALS} literals"):
        parse_condition(many, TABLE, COLUMNS)
    with pytest.raises(ConfigError, match="longer than"):
        parse_condition("id = 1 OR " * 3000 + "id = 1", TABLE, COLUMNS)


def _random_condition(rng: random.Random, depth: int = 0) -> str:
    if depth < 3 and rng.random() < 0.4:
        op = rng.choice([" AND ", " OR ", " and ", "\nOR\t"])
        inner = op.join(_random_condition(rng, depth + 1) for _ in range(rng.randint(2, 3)))
        return rng.choice(["({})", "NOT ({})", "{}"]).format(inner) if depth else inner
    col = rng.choice(["id", "a", "B", '"c"'])
    lit = lambda: rng.choice(["1", "-2.5", "'x''y'", "'é😀'", "TRUE", "DATE '2024-01-01'", "1e2", "''"])  # noqa: E731
    return rng.choice(
        [
            f"{col} {rng.choice(['=', '<>', '!=', '<', '<=', '>', '>='])} {lit()}",
            f"{col} IS {rng.choice(['', 'NOT '])}NULL",
            f"{col} {rng.choice(['', 'NOT '])}IN ({', '.join(lit() for _ in range(rng.randint(1, 3)))})",
            f"{col} {rng.choice(['', 'NOT '])}BETWEEN {lit()} AND {lit()}",
        ]
    )


def test_generated_conditions_parse_and_mutations_only_ever_raise_config_error():
    rng = random.Random(14)
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (id, a, b, c)")
    noise = list("()'\",;-+*/=<>!.0e\\`[]#@%?\n\x00é") + [" AND ", " OR ", " SELECT ", "--", "/*", "NULL"]
    refused = 0
    for _ in range(1500):
        text = _random_condition(rng)
        sql, params = render(text, ["id", "a", "b", "c"])
        assert sql.count("?") == len(params)
        db.execute(f"SELECT * FROM t WHERE {sql}", [str(p) if isinstance(p, Decimal | dt.date) else p for p in params])  # noqa: S608
        at = rng.randint(0, len(text))
        mutated = text[:at] + rng.choice(noise) + text[at + rng.randint(0, 2) :]
        try:
            sql, params = render(mutated, ["id", "a", "b", "c"])
        except ConfigError:
            refused += 1
            continue
        assert sql.count("?") == len(params)
        assert not any(bad in sql for bad in (";", "--", "/*", "SELECT"))
    assert refused > 500


def test_rendered_sql_selects_exactly_the_matching_rows():
    """The rendering keeps the meaning (precedence, NOT, NULLs): sqlite against a Python predicate."""
    rows = [(i, s, a) for i in range(1, 31) for s, a in [(("open", "it's", None)[i % 3], (None, i * 2)[i % 2])]]
    db = sqlite3.connect(":memory:")
    db.execute('CREATE TABLE t (id INTEGER, status TEXT, "amount" INTEGER)')
    db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    cases = {
        "status = 'it''s' AND id BETWEEN 10 AND 20 OR amount IS NULL": lambda i, s, a: (
            (s == "it's" and 10 <= i <= 20) or a is None
        ),
        "NOT (id < 5 OR id > 25) AND status IN ('open', 'it''s')": lambda i, s, a: (
            not (i < 5 or i > 25) and s in ("open", "it's")
        ),
        "id NOT BETWEEN 3 AND 27 OR NOT status IS NULL AND amount >= 40": lambda i, s, a: (
            not (3 <= i <= 27) or (s is not None and a is not None and a >= 40)
        ),
        "status <> 'open'": lambda i, s, a: s is not None and s != "open",
    }
    for text, expected in cases.items():
        sql, params = render(text, ["id", "status", "amount"])
        got = [r[0] for r in db.execute(f"SELECT id FROM t WHERE {sql} ORDER BY id", params)]  # noqa: S608
        assert got == [i for i, s, a in rows if expected(i, s, a)], text


def test_condition_pieces_raw_and_empty():
    assert condition_pieces(TABLE, None, COLUMNS, False) is None
    assert condition_pieces(TABLE, "  ", COLUMNS, False) is None
    assert condition_pieces(TABLE, "id % 10 = 0", COLUMNS, True) == [("raw", "id % 10 = 0")]
    with pytest.raises(ConfigError, match="character '%' is not allowed"):
        condition_pieces(TABLE, "id % 10 = 0", COLUMNS, False)


def test_dialects_quote_identifiers_and_bind_literals():
    pieces = parse_condition(
        "\"a`b]c\"\"d%\" = 'x''y' AND day = DATE '2024-01-02' AND ts < TIMESTAMP '2024-01-02 03:04:05.5'"
        " AND id IN (1, 99999999999999999999)",
        TABLE,
        ['a`b]c"d%', "day", "ts", "id"],
    ).pieces()
    pg = pg_sql.user_condition(pieces).as_string(None)
    assert pg == (
        "(((\"a`b]c\"\"d%\" = 'x''y') AND (\"day\" = '2024-01-02'::date) AND "
        "(\"ts\" < '2024-01-02 03:04:05.500000'::timestamp) AND (\"id\" IN (1, 99999999999999999999))))"
    )
    text, args = mysql_sql.condition_sql(pieces)
    assert text == "(((`a``b]c\"d%%` = %s) AND (`day` = %s) AND (`ts` < %s) AND (`id` IN (%s, %s))))"
    assert args == ["x'y", dt.date(2024, 1, 2), dt.datetime(2024, 1, 2, 3, 4, 5, 500000), 1, Decimal(10**20 - 1)]
    text, args = mssql_sql.condition_sql(pieces)
    assert text == '((([a`b]]c"d%] = ?) AND ([day] = ?) AND ([ts] < ?) AND ([id] IN (?, ?))))'
    assert args == ["x'y", "2024-01-02", "2024-01-02 03:04:05.500000", 1, Decimal(10**20 - 1)]


def test_dialects_pass_raw_sql_as_written():
    raw = [("raw", "id % 10 = 0")]
    assert pg_sql.user_condition(raw).as_string(None) == "(id % 10 = 0)"
    assert mysql_sql.condition_sql(raw) == ("(id %% 10 = 0)", [])  # pymysql %-formats it back
    assert mssql_sql.condition_sql(raw) == ("(id % 10 = 0)", [])
    query, args = mysql_sql.max_key("d%b", "t", ["`id`"], ["id"], raw)
    assert query == "SELECT `id` FROM `d%%b`.`t` WHERE (id %% 10 = 0) ORDER BY `id` DESC LIMIT 1" and args == []
    assert mysql_sql.max_key("d%b", "t", ["`id`"], ["id"], None) == (
        "SELECT `id` FROM `d%b`.`t` ORDER BY `id` DESC LIMIT 1",
        None,
    )


def test_check_signals_before_anything_is_stored():
    tables = ["public.a", "public.b"]
    columns = {"public.a": ["id", "v"], "public.b": ["id"]}

    def sig(cond: dict) -> list:
        return [parse_signal({"execute-snapshot": {"data-collections": ["public.*"], "additional-conditions": [cond]}})]

    check_signals(sig({"data-collection": "public.a", "filter": "v = 'x'"}), tables, columns.get, False)
    with pytest.raises(ConfigError, match="additional-conditions of public.b: table public.b has no column 'v'"):
        check_signals(sig({"data-collection": "public\\..*", "filter": "v = 'x'"}), tables, columns.get, False)
    with pytest.raises(ConfigError, match="character '%'"):
        check_signals(sig({"data-collection": "public.a", "filter": "id % 2 = 0"}), tables, columns.get, False)
    check_signals(sig({"data-collection": "public.a", "filter": "id % 2 = 0"}), tables, columns.get, True)
    with pytest.raises(ConfigError, match="data-collection 'public.zz' matches none of the tables to snapshot"):
        check_signals(sig({"data-collection": "public.zz", "filter": "id = 1"}), tables, columns.get, False)
    with pytest.raises(ConfigError, match="match no captured table"):
        check_signals(
            [parse_signal({"execute-snapshot": {"data-collections": ["x.y"]}})], tables, columns.get, False
        )
    stop = parse_signal({"stop-snapshot": {"data-collections": ["nothing"]}})
    check_signals([stop], tables, columns.get, False)  # stop signals have nothing to check
