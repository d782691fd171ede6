"""Fixtures for the Vitess tests: three shard servers and a VtgateEmulator for the session.

Each test uses its own keyspace (``vt_<keyspace>`` databases), so tests share the servers; a
shard's stream therefore also carries other keyspaces' transactions as empty ``BEGIN, VGTID,
COMMIT`` groups, as a real shard's stream carries transactions on tables it does not stream.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_cdc.testing.servers import MariaDbServer
from airflow_cdc.testing.vitess_emulator import VtgateEmulator, start_shard_server


@pytest.fixture(scope="session")
def shard_servers() -> Iterator[list[MariaDbServer]]:
    """Three MariaDB servers: one for unsharded keyspaces, two as reshard targets."""
    servers: list[MariaDbServer] = []
    try:
        for _ in range(3):
            servers.append(start_shard_server())
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="session")
def vtgate(shard_servers: list[MariaDbServer]) -> Iterator[VtgateEmulator]:
    with VtgateEmulator(copy_chunk_rows=4) as emulator:
        yield emulator


@pytest.fixture
def keyspace() -> str:
    return f"ks_{uuid.uuid4().hex[:10]}"
