"""The SQL Server source: CDC change tables read through pyodbc (FreeTDS or Microsoft's driver)."""
