"""The MySQL 8 server of ``AIRFLOW_CDC_MYSQL8_URL`` and a database of its own per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql
import pytest

URL = os.environ.get("AIRFLOW_CDC_MYSQL8_URL", "")
SKIP_REASON = (
    "no MySQL 8 server: set AIRFLOW_CDC_MYSQL8_URL=mysql://user:password@host:port "
    "(GTID mode ON) to run the MySQL 8 suite"
)


@dataclass
class Mysql8Server:
    host: str
    port: int
    superuser: str
    password: str

    def connect(self, **kwargs: Any) -> Any:
        params = {"host": self.host, "port": self.port, "user": self.superuser, "password": self.password}
        return pymysql.connect(**{**params, **kwargs})


@dataclass
class Mysql8Database:
    name: str
    server: Mysql8Server

    def connect(self, **kwargs: Any) -> Any:
        return self.server.connect(database=self.name, **kwargs)


@pytest.fixture
def mysql8_db() -> Iterator[Mysql8Database]:
    parts = urlsplit(URL)
    server = Mysql8Server(
        parts.hostname or "127.0.0.1",
        parts.port or 3306,
        unquote(parts.username or "root"),
        unquote(parts.password or ""),
    )
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = server.connect(autocommit=True)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
        yield Mysql8Database(name, server)
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()
