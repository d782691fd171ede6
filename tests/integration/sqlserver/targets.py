"""One face for the SQL Server emulator and a real SQL Server, so the tests of real-server behaviour
(``test_real_behaviours.py``) run unchanged against both.

Writes are plain SQL both dialects run (``INSERT``/``UPDATE``/``DELETE`` with literals from
:meth:`Target.binary` and :meth:`Target.repeat`); the emulator runs them on its backing PostgreSQL
database, the real server as T-SQL.  ``run_capture_job`` is one scan of the log (the emulator's
capture job; ``sys.sp_cdc_scan`` on the real server, whose capture job the suite keeps stopped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_cdc.core.batch import list_batches


@dataclass
class Column:
    name: str
    type: str  # SQL Server's type
    computed: tuple[str, str] | None = None  # (T-SQL expression, PostgreSQL expression)


@dataclass
class Target:
    """A database with CDC enabled, on the emulator or a real server."""

    database: str
    staging: Path
    kind: str = ""
    created: list[str] = field(default_factory=list)

    # -- to implement --------------------------------------------------------------------------
    def create_table(
        self, table: str, columns: Sequence[Column], key: Sequence[str], unique: Sequence[Sequence[str]] = ()
    ) -> None:
        raise NotImplementedError

    def enable(self, table: str, capture_instance: str | None = None) -> None:
        """``sys.sp_cdc_enable_table`` (the log is not scanned: :meth:`run_capture_job`)."""
        raise NotImplementedError

    def add_column(self, table: str, column: str, type_: str) -> None:
        raise NotImplementedError

    def write(self, *statements: str) -> None:
        """Run the statements in one transaction."""
        raise NotImplementedError

    def run_capture_job(self) -> None:
        raise NotImplementedError

    def rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        raise NotImplementedError

    def properties(self) -> dict[str, Any]:
        raise NotImplementedError

    def start_lsn(self, capture_instance: str) -> bytes | None:
        """``cdc.change_tables.start_lsn`` of a capture instance."""
        raise NotImplementedError

    def binary(self, data: bytes) -> str:
        raise NotImplementedError

    def repeat(self, text: str, times: int) -> str:
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------
    def config(self, **props: Any) -> dict[str, Any]:
        return {"name": f"rb_{self.database}", "connector": "sqlserver", "staging.path": str(self.staging),
                "snapshot.isolation.mode": "snapshot", **self.properties(),
                **{k.replace("__", "."): v for k, v in props.items()}}  # fmt: skip

    def staged(self, table: str) -> str:
        return f"{self.database}.{table}"

    def staged_events(self, config: dict[str, Any], table: str) -> list[dict[str, Any]]:
        """Every staged event of ``schema.table``, in staging order."""
        out: list[dict[str, Any]] = []
        for batch in list_batches(config["staging.path"], config["name"]):
            if self.staged(table) in batch.tables():
                for rb in batch.iter_events(self.staged(table)):
                    out.extend(rb.to_pylist())
        return out


@dataclass
class EmulatorTarget(Target):
    emulator: Any = None

    def create_table(
        self, table: str, columns: Sequence[Column], key: Sequence[str], unique: Sequence[Sequence[str]] = ()
    ) -> None:
        self.emulator.create_table(
            self.database, table, [(c.name, c.type) for c in columns], primary_key=list(key),
            computed={c.name: c.computed[1] for c in columns if c.computed}, unique=unique,
        )  # fmt: skip

    def enable(self, table: str, capture_instance: str | None = None) -> None:
        self.emulator.enable_table(self.database, table, capture_instance=capture_instance)

    def add_column(self, table: str, column: str, type_: str) -> None:
        self.emulator.add_column(self.database, table, column, type_)

    def write(self, *statements: str) -> None:
        with self.emulator.pg_connect(self.database) as conn:
            conn.execute("SET search_path TO dbo")
            for statement in statements:
                conn.execute(statement.replace("%", "%%"))

    def run_capture_job(self) -> None:
        self.emulator.run_capture_job(self.database)

    def rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        schema, _, name = table.partition(".")
        cols = ", ".join(f'"{c}"' for c in columns)
        with self.emulator.pg_connect(self.database) as conn:
            return [tuple(r) for r in conn.execute(f'SELECT {cols} FROM "{schema}"."{name}"').fetchall()]  # noqa: S608

    def properties(self) -> dict[str, Any]:
        emu = self.emulator
        return {"database.hostname": emu.host, "database.port": emu.port, "database.user": emu.user,
                "database.password": emu.password, "database.names": self.database,
                "database.encrypt": False}  # fmt: skip

    def start_lsn(self, capture_instance: str) -> bytes | None:
        with self.emulator.pg_connect(self.database) as conn:
            row = conn.execute(
                "SELECT start_lsn FROM cdc.change_tables WHERE capture_instance = %s", (capture_instance,)
            ).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def binary(self, data: bytes) -> str:
        return f"'\\x{data.hex()}'::bytea"

    def repeat(self, text: str, times: int) -> str:
        return f"repeat('{text}', {times})"


@dataclass
class RealTarget(Target):
    server: Any = None

    def create_table(
        self, table: str, columns: Sequence[Column], key: Sequence[str], unique: Sequence[Sequence[str]] = ()
    ) -> None:
        defs = [f"[{c.name}] AS ({c.computed[0]})" if c.computed else
                f"[{c.name}] {c.type}{' NOT NULL' if c.name in key else ''}" for c in columns]  # fmt: skip
        defs.append(f"PRIMARY KEY ({', '.join(f'[{k}]' for k in key)})")
        defs += [f"UNIQUE ({', '.join(f'[{c}]' for c in u)})" for u in unique]
        schema, _, name = table.partition(".")
        self.server.execute(self.database, f"CREATE TABLE [{schema}].[{name}] ({', '.join(defs)})")

    def enable(self, table: str, capture_instance: str | None = None) -> None:
        schema, _, name = table.partition(".")
        extra = f", @capture_instance = N'{capture_instance}'" if capture_instance else ""
        self.server.execute(self.database, f"EXEC sys.sp_cdc_enable_table @source_schema = N'{schema}',"
                                           f" @source_name = N'{name}', @role_name = NULL{extra}")  # fmt: skip
        try:
            self.server.execute(self.database, "EXEC sys.sp_cdc_stop_job @job_type = N'capture'")
        except Exception:  # already stopped
            pass

    def add_column(self, table: str, column: str, type_: str) -> None:
        schema, _, name = table.partition(".")
        self.server.execute(self.database, f"ALTER TABLE [{schema}].[{name}] ADD [{column}] {type_} NULL")

    def write(self, *statements: str) -> None:
        self.server.execute(self.database, "BEGIN TRANSACTION", *statements, "COMMIT TRANSACTION")

    def run_capture_job(self) -> None:
        self.server.run_capture_job(self.database)

    def rows(self, table: str, columns: Sequence[str]) -> list[tuple]:
        schema, _, name = table.partition(".")
        conn = self.server.connect(self.database)
        try:
            cols = ", ".join(f"[{c}]" for c in columns)
            return [tuple(r) for r in conn.cursor().execute(f"SELECT {cols} FROM [{schema}].[{name}]").fetchall()]  # noqa: S608
        finally:
            conn.close()

    def properties(self) -> dict[str, Any]:
        return dict(self.server.properties(self.database))

    def start_lsn(self, capture_instance: str) -> bytes | None:
        conn = self.server.connect(self.database)
        try:
            row = conn.cursor().execute(
                "SELECT start_lsn FROM cdc.change_tables WHERE capture_instance = ?", capture_instance
            ).fetchone()
        finally:
            conn.close()
        return None if row is None or row[0] is None else bytes(row[0])

    def binary(self, data: bytes) -> str:
        return f"0x{data.hex()}"

    def repeat(self, text: str, times: int) -> str:
        return f"REPLICATE(CONVERT(nvarchar(max), N'{text}'), {times})"
