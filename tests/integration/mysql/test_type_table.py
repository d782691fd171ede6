"""The generated type-table test (:mod:`tests.integration.mysql.type_table`) on MariaDB 10.11:
every type of Debezium's MySQL mapping at its limits and CHAR/VARCHAR/TEXT/ENUM/SET in every
character set the server offers, through snapshot chunks, snapshot parts, the stream and the
stream after an ALTER TABLE that adds the column or changes and renames one into it."""

from __future__ import annotations

from tests.integration.mysql.type_table import TypeTable


def test_type_table_through_every_path(mariadb_db, tmp_path):
    table = TypeTable(mariadb_db, "mariadb")
    assert len(table.cases) > 150  # every generic case and 5 per character set (30+ on MariaDB)
    mismatches = table.run(tmp_path)
    assert mismatches == {path: [] for path in mismatches}, {p: m[:40] for p, m in mismatches.items() if m}
