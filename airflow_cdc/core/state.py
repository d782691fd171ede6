"""Connector state persistence: the contract, the stored record and URL-based store selection.

A connector's state (source offset plus snapshot progress) is a JSON object.  A store keeps the
latest committed state of each connector together with an integer *version* used for
compare-and-set, so two concurrent runs of one connector can never both commit.

Implementations: :class:`airflow_cdc.core.state_file.FileStateStore` (a directory of JSON files)
and :class:`airflow_cdc.core.state_sql.SqlStateStore` (a table in any PEP 249 database).  Pick one
from a URL with :func:`open_state_store`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from airflow_cdc.core.errors import CdcError, ConfigError
from airflow_cdc.core.redact import redact_url

MAX_CONNECTOR_NAME = 255

#: URL schemes contributed by integrations (the Airflow provider registers ``airflow-variable``),
#: so this module never imports them.
_EXTRA_SCHEMES: dict[str, Callable[[str], StateStore]] = {}


def register_state_store(scheme: str, factory: Callable[[str], StateStore]) -> None:
    """Make :func:`open_state_store` open URLs of ``scheme`` with ``factory(url)``."""
    _EXTRA_SCHEMES[scheme.lower()] = factory


class StateCorrupt(CdcError):
    """A stored state exists but cannot be read back (edited by hand, damaged storage)."""

    default_hint = "restore the state from a backup, or delete it to start the connector from scratch"


@dataclass(frozen=True)
class StoredState:
    """One committed state.

    :param version: store-assigned version, 1 for the first commit, +1 for each later commit.
    :param data: the connector's state, a JSON object.
    :param updated_at: commit time, ISO-8601 in UTC.
    """

    version: int
    data: dict[str, Any]
    updated_at: str


@runtime_checkable
class StateStore(Protocol):
    """Durable, versioned storage of connector states.

    Contract, for every implementation:

    * ``load(connector)`` returns the last committed :class:`StoredState` of ``connector``, or
      ``None`` when it has none.  It never returns a state older than one whose commit was
      acknowledged (by ``compare_and_set`` returning) to any caller.
    * ``compare_and_set(connector, expected_version, data)`` writes ``data`` only if the stored
      version still equals ``expected_version`` (``None``: no state may exist yet) and returns the
      new version (``expected_version + 1``, or 1).  Otherwise it writes nothing and raises
      :class:`airflow_cdc.core.errors.StateConflict`, so of two runs that loaded the same version
      exactly one can commit.  ``data`` must be a JSON-serialisable ``dict`` (no NaN/Infinity).
    * Writes are atomic and durable: after a crash at any point, ``load`` returns either the old
      or the new state, never a torn or partial one, and an acknowledged commit survives.
    * ``delete(connector)`` removes the state (no error if there is none); the next successful
      ``compare_and_set`` must then pass ``expected_version=None`` and starts again at version 1.
    * ``describe()`` names the location for humans (logs, errors); it never contains secrets.
    * ``lease_store()`` returns a sibling store of the same backend, for the per-connector lease
      records of :mod:`airflow_cdc.core.lease` (kept apart so renewing a lease never changes the
      state's version); the same object on every call.

    Keeping progress from moving backward (offsets only grow) is the caller's job, not the store's.
    Connector names are non-empty strings of at most 255 characters.
    """

    def load(self, connector: str) -> StoredState | None: ...

    def compare_and_set(self, connector: str, expected_version: int | None, data: dict[str, Any]) -> int: ...

    def delete(self, connector: str) -> None: ...

    def describe(self) -> str: ...

    def lease_store(self) -> StateStore: ...


def utc_now_iso() -> str:
    """Return the current time as ISO-8601 UTC, e.g. ``2024-05-01T12:00:00.000001+00:00``."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def check_connector(connector: str) -> str:
    """Validate a connector name and return it.

    :param connector: the name to check.
    :raises ConfigError: when it is not a non-empty string of at most 255 characters.
    """
    if not isinstance(connector, str) or not connector or len(connector) > MAX_CONNECTOR_NAME:
        raise ConfigError(f"invalid connector name {connector!r}: need 1 to {MAX_CONNECTOR_NAME} characters")
    if "\x00" in connector:
        raise ConfigError(f"invalid connector name {connector!r}: contains a NUL character")
    return connector


def check_expected_version(expected_version: int | None) -> None:
    """Reject an ``expected_version`` that no store could hold.

    :param expected_version: ``None`` or a positive ``int``.
    :raises TypeError: for any other value.
    """
    valid = expected_version is None or (
        isinstance(expected_version, int) and not isinstance(expected_version, bool) and expected_version > 0
    )
    if not valid:
        raise TypeError(f"expected_version must be None or a positive int, not {expected_version!r}")


def encode_state(data: dict[str, Any], *, pretty: bool = False) -> str:
    """Serialise a state to JSON text, rejecting anything that would not load back identically.

    :param data: the state; must be a ``dict`` with string keys, JSON values and finite numbers.
    :param pretty: indent and keep non-ASCII characters (for files meant to be read by people).
    :raises TypeError: when ``data`` is not a JSON object of JSON values.
    """
    if not isinstance(data, dict):
        raise TypeError(f"state must be a dict, not {type(data).__name__}")
    try:
        if pretty:
            return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:  # NaN / Infinity / circular reference
        raise TypeError(f"state is not representable as JSON: {exc}") from exc


def decode_state(text: str, where: str) -> dict[str, Any]:
    """Parse stored JSON text back into a state dict.

    :param text: JSON text as stored.
    :param where: location for the error message.
    :raises ValueError: when the text is not a JSON object.
    """
    value = json.loads(text, parse_constant=_reject_constant)
    if not isinstance(value, dict):
        raise ValueError(f"stored state at {where} is not a JSON object")
    return value


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in stored state")


def open_state_store(url: str) -> StateStore:
    """Open the state store a URL names.

    * ``file:///abs/dir`` or a bare path (``/abs/dir``, ``rel/dir``): :class:`FileStateStore`;
    * ``postgresql://user:pass@host:port/db`` (or ``postgres://``): a table through psycopg;
    * ``mysql://user:pass@host:port/db`` (or ``mariadb://``, ``mysql+pymysql://``): through pymysql;
    * ``sqlite:///abs/path.db`` or ``sqlite:rel/path.db``: through sqlite3.

    SQL URLs take an optional ``?table=name`` (``schema.name`` allowed; default ``airflow_cdc_state``);
    other query parameters of a PostgreSQL URL are passed on to libpq.

    :param url: the store URL.
    :raises ConfigError: for an unknown scheme or a malformed URL.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("state store URL is empty")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in _EXTRA_SCHEMES:
        return _EXTRA_SCHEMES[scheme](url)
    if scheme in ("", "file"):
        from airflow_cdc.core.state_file import FileStateStore

        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise ConfigError(f"file state store URL must be file:///absolute/path, got {redact_url(url)!r}")
        return FileStateStore(unquote(parts.path) if scheme else url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    table = next((v for k, v in query if k == "table"), "airflow_cdc_state")
    rest = [(k, v) for k, v in query if k != "table"]
    if scheme in ("postgresql", "postgres"):
        return _open_postgres(parts._replace(query=urlencode(rest)).geturl(), table, _redact(parts, table))
    if scheme in ("mysql", "mariadb", "mysql+pymysql"):
        return _open_mysql(parts, dict(rest), table)
    if scheme == "sqlite":
        return _open_sqlite(parts, table)
    raise ConfigError(
        f"unsupported state store URL scheme {parts.scheme!r}; use file, postgresql, mysql or sqlite"
        + (
            " (airflow-variable needs the Airflow provider: import airflow_cdc.airflow.state_variable)"
            if scheme == "airflow-variable"
            else ""
        )
    )


def _redact(parts: Any, table: str) -> str:
    """Rebuild a URL without password and without query parameters other than the table."""
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + (f"[{host}]" if ":" in host else host)
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, f"table={table}", ""))


def _open_postgres(conninfo: str, table: str, description: str) -> StateStore:
    import psycopg

    from airflow_cdc.core.state_sql import SqlStateStore

    return SqlStateStore(lambda: psycopg.connect(conninfo), table, "postgresql", description=description)


def _open_mysql(parts: Any, options: dict[str, str], table: str) -> StateStore:
    import pymysql

    from airflow_cdc.core.state_sql import SqlStateStore

    kwargs: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": parts.port or 3306,
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "database": unquote(parts.path.lstrip("/")) or None,
        "charset": options.get("charset", "utf8mb4"),
        "connect_timeout": int(options.get("connect_timeout", "10")),
    }
    if "unix_socket" in options:
        kwargs["unix_socket"] = options["unix_socket"]
    return SqlStateStore(lambda: pymysql.connect(**kwargs), table, "mysql", description=_redact(parts, table))


def _open_sqlite(parts: Any, table: str) -> StateStore:
    import sqlite3

    from airflow_cdc.core.state_sql import SqlStateStore

    path = unquote(parts.path)
    if parts.netloc or not path or path == ":memory:":
        raise ConfigError("sqlite state store URL must be sqlite:///absolute/path.db or sqlite:relative.db")
    return SqlStateStore(
        lambda: sqlite3.connect(path, timeout=30), table, "sqlite", description=f"sqlite:{path}?table={table}"
    )
