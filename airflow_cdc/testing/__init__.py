"""Test helpers: throwaway database servers for tests, benchmarks and the demo."""

from airflow_cdc.testing.servers import (
    MariaDbServer,
    PostgresServer,
    ServerStartError,
    ensure_installed,
    free_port,
)

__all__ = ["MariaDbServer", "PostgresServer", "ServerStartError", "ensure_installed", "free_port"]
