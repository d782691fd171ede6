"""``database.initial.statements``: the operator's SQL run on each new database connection.

Debezium's rule (``JdbcConnection.parseSqlStatementString``): statements are separated by ``;``;
two in a row (``;;``) stand for one ``;`` inside a statement; a trailing ``;`` ends the last
statement.  The connector opens connections when it needs them, so the statements should set
session parameters, not change data.  They are not run on a connection that reads the log by
the replication protocol.
"""

from __future__ import annotations

#: stands for an escaped ``;`` while the text is split (a private-use character: not SQL)
_ESCAPED = "\ue000"


def split_statements(text: str | None) -> list[str]:
    """The statements of ``text``, trimmed, empty ones dropped (``a;;b; c;`` -> ``["a;b", "c"]``).
    Pairs are read left to right, as Debezium reads them: ``a;;;b`` is ``a;`` then ``b``."""
    parts = (text or "").replace(";;", _ESCAPED).split(";")
    return [p.replace(_ESCAPED, ";").strip() for p in parts if p.strip()]
