"""pyodbc connections to SQL Server from Debezium's properties, and error mapping.

The driver is FreeTDS (Debian's ``tdsodbc``) by default or Microsoft's ODBC driver; their
connection-string keywords differ for TLS, so the string is built per driver.  Time values are
read through output converters so ``datetime2(7)``/``time(7)`` keep their 100 ns digits and
``datetimeoffset`` (which pyodbc does not know) its offset.

CLR values (``hierarchyid``, ``geometry``, ``geography``) are read as their serialisation: FreeTDS
reports them as ``SQL_LONGVARBINARY``, msodbcsql as ``SQL_SS_UDT`` (-151), which pyodbc does not
know (it fails the fetch), hence a converter.  ``sql_variant`` (``SQL_SS_VARIANT``, -150) gets none
on purpose: pyodbc reads it typed through ``SQL_CA_SS_VARIANT_TYPE`` where the driver has it
(msodbcsql); FreeTDS 1.3 has not (``SQLColAttribute`` fails the fetch), and its ``SQL_C_BINARY``
form is no substitute (no base type; a decimal fails with 07006), so the source never selects a
sql_variant column (:mod:`.types`).
"""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import AuthenticationFailed, CdcError, ConfigError, ConnectionFailed

SQL_TYPE_TIMESTAMP, SQL_SS_TIME2, SQL_SS_TIMESTAMPOFFSET = 93, -154, -155
SQL_SS_UDT = -151
_EPOCH = dt.datetime(1970, 1, 1)
_DT_EPOCH = dt.datetime(1900, 1, 1)


def odbc_value(value: str) -> str:
    """Brace-quote a connection-string value when it needs it (``}`` doubled)."""
    if any(c in value for c in ";{}=") or value != value.strip():
        return "{" + value.replace("}", "}}") + "}"
    return value


def is_freetds(driver: str) -> bool:
    return "freetds" in driver.lower() or driver.endswith("libtdsodbc.so")


def connection_string(config: ConnectorConfig, database: str | None = None) -> str:
    """The ODBC connection string for ``config`` (contains the password: never log it)."""
    driver = config["database.odbc.driver"]
    host = config["database.hostname"]
    if config["database.instance"]:
        host = f"{host}\\{config['database.instance']}"
    parts = [f"DRIVER={odbc_value(driver) if '/' in driver else '{' + driver + '}'}"]
    encrypt, trust = config["database.encrypt"], config["database.trustServerCertificate"]
    if is_freetds(driver):
        parts += [
            f"SERVER={odbc_value(host)}",
            f"PORT={config['database.port']}",
            f"TDS_Version={config['database.odbc.tds.version']}",
            "ClientCharset=UTF-8",
            f"Encryption={'require' if encrypt else 'off'}",
        ]
    else:
        parts += [
            "SERVER=" + odbc_value(f"tcp:{host},{config['database.port']}"),
            f"Encrypt={'yes' if encrypt else 'no'}",
            f"TrustServerCertificate={'yes' if trust else 'no'}",
        ]
    if config["database.applicationIntent"] == "readonly":
        parts.append("ApplicationIntent=ReadOnly")
    parts.append(f"UID={odbc_value(config['database.user'] or '')}")
    parts.append(f"PWD={odbc_value(config.secret('database.password') or '')}")
    if database:
        parts.append(f"DATABASE={odbc_value(database)}")
    return ";".join(parts)


def connect(config: ConnectorConfig, database: str | None = None) -> Any:
    """Open an autocommit pyodbc connection with the exact time converters installed.

    :raises AuthenticationFailed: SQL Server error 18456 (wrong user or password).
    :raises ConfigError: error 4060 (the database does not exist or the login may not open it).
    :raises ConnectionFailed: the server could not be reached.
    """
    import pyodbc

    timeout_s = max(1, config["database.query.timeout.ms"] // 1000)
    try:
        conn = pyodbc.connect(connection_string(config, database), autocommit=True, timeout=15)
    except pyodbc.Error as e:
        raise connect_error(e, config, database) from e
    conn.timeout = timeout_s
    conn.add_output_converter(SQL_SS_TIMESTAMPOFFSET, _datetimeoffset)
    conn.add_output_converter(SQL_SS_TIME2, _time2)
    conn.add_output_converter(SQL_TYPE_TIMESTAMP, _timestamp)
    conn.add_output_converter(SQL_SS_UDT, _raw)
    return conn


def connect_error(e: Exception, config: ConnectorConfig, database: str | None) -> CdcError:
    text = str(e.args[1] if len(e.args) > 1 else e)
    where = f"{config['database.hostname']}:{config['database.port']}"
    if "(18456)" in text:
        return AuthenticationFailed(
            f"SQL Server at {where} rejected the login of {config['database.user']!r}"
        )
    if "(4060)" in text:
        return ConfigError(f"database {database!r} of database.names cannot be opened on {where}: {text}")
    return ConnectionFailed(f"cannot connect to SQL Server at {where}: {text}")


def _timestamp(raw: bytes | None) -> int | None:
    """datetime2/datetime/smalldatetime as nanoseconds since 1970-01-01 (naive, as stored).

    The ODBC struct (16 bytes) keeps datetime2's 100 ns digit; FreeTDS hands the legacy types over
    in their TDS form (8 bytes: days since 1900 and 1/300 s ticks; 4 bytes: days and minutes).
    """
    if raw is None:
        return None
    if len(raw) == 16:
        y, mo, d, h, mi, s, ns = struct.unpack("<6hI", raw)
        base = dt.datetime(y, mo, d, h, mi, s)
    elif len(raw) == 8:
        days, ticks = struct.unpack("<iI", raw)
        # 1/300 s ticks, rounded to the millisecond as SQL Server shows them (.000/.003/.007)
        base, ns = _DT_EPOCH + dt.timedelta(days=days), (ticks * 10 + 1) // 3 * 10**6
    elif len(raw) == 4:
        days, minutes = struct.unpack("<HH", raw)
        base, ns = _DT_EPOCH + dt.timedelta(days=days, minutes=minutes), 0
    else:
        raise ValueError(f"unexpected SQL_TYPE_TIMESTAMP value of {len(raw)} bytes")
    delta = base - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 10**9 + ns


def _raw(raw: bytes | None) -> bytes | None:
    """The value as the driver's ``SQL_C_BINARY`` bytes (a CLR value's serialisation)."""
    return None if raw is None else bytes(raw)


def _time2(raw: bytes | None) -> Any:
    if raw is None:
        return None
    hour, minute, second, fraction = struct.unpack("<3H2xI", raw)
    return (hour * 3600 + minute * 60 + second) * 10**9 + fraction  # nanoseconds since midnight


def _datetimeoffset(raw: bytes | None) -> Any:
    if raw is None:
        return None
    y, mo, d, h, mi, s, ns, tzh, tzm = struct.unpack("<6hI2h", raw)
    tz = dt.timezone(dt.timedelta(hours=tzh, minutes=tzm if tzh >= 0 else -abs(tzm)))
    return (dt.datetime(y, mo, d, h, mi, s, ns // 1000, tzinfo=tz), ns % 1000)


def scalar(conn: Any, query: str, *params: Any) -> Any:
    """The first column of the first row, with the result fully read and the cursor closed.

    FreeTDS has no MARS: a result left open makes the connection's next statement fail with
    "Invalid cursor state", so nothing may stop at ``fetchone``.
    """
    cur = conn.cursor()
    try:
        rows = cur.execute(query, *params).fetchall()
    finally:
        cur.close()
    return rows[0][0] if rows else None
