"""Fixtures of the contract suite's SQL Server harness (a module-scoped CDC emulator)."""

# harness first: it registers the SQL Server harness, which subclasses its Harness.
from tests.contract.harness import HARNESSES
from tests.contract.harness_sqlserver import contract_sqlserver_emulator, mssql_contract_db

__all__ = ["HARNESSES", "contract_sqlserver_emulator", "mssql_contract_db"]
