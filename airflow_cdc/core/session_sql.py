"""``database.initial.statements``: the operator's SQL run on each new database connection.

Debezium's rule (``JdbcConnection.parseSqlStatementString``): statements are separated by ``;``;
two in a row (``;;``) stand for one ``;`` inside a statement; a trailing ``;`` ends the last
statement.  The connector opens connections when it needs them, so the statements should set
session parameters, not change data.  They are not run on a connection that reads the log by
the replication protocol.
"""

from __future__ import annotations


def split_statements(text: str | None) -> list[str]:
    """The statements of ``text``, trimmed, empty ones dropped (``a;;b; c;`` -> ``["a;b", "c"]``)."""
    out: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text or ""):
        char = (text or "")[i]
        if char == ";" and (text or "")[i + 1 : i + 2] == ";":
            current.append(";")
            i += 2
            continue
        if char == ";":
            out.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    out.append("".join(current))
    return [s.strip() for s in out if s.strip()]
