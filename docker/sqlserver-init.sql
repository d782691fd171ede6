-- SQL Server sample database with CDC enabled (run once by the sqlserver-init service).
-- Idempotent: every step checks first, so re-running the service changes nothing.
IF DB_ID('shop') IS NULL CREATE DATABASE shop;
GO
-- snapshot.isolation.mode=snapshot (the example pipeline) needs row versioning on the database
ALTER DATABASE shop SET ALLOW_SNAPSHOT_ISOLATION ON;
GO
USE shop;
GO
IF OBJECT_ID('dbo.customers') IS NULL
BEGIN
    CREATE TABLE dbo.customers (id int PRIMARY KEY, name nvarchar(200) NOT NULL, email nvarchar(200) NULL);
    INSERT INTO dbo.customers (id, name, email)
    SELECT TOP (50) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)), 'customer', NULL FROM sys.objects;
END
GO
IF OBJECT_ID('dbo.orders') IS NULL
BEGIN
    CREATE TABLE dbo.orders (
        id int PRIMARY KEY, customer_id int NOT NULL, amount decimal(10, 2) NOT NULL,
        created_at datetime2(3) NOT NULL DEFAULT SYSUTCDATETIME()
    );
    INSERT INTO dbo.orders (id, customer_id, amount)
    SELECT TOP (200) n, 1 + n % 50, n * 1.25
    FROM (SELECT ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS n FROM sys.all_objects) AS t;
END
GO
IF (SELECT is_cdc_enabled FROM sys.databases WHERE name = 'shop') = 0 EXEC sys.sp_cdc_enable_db;
GO
IF NOT EXISTS (SELECT 1 FROM cdc.change_tables WHERE source_object_id = OBJECT_ID('dbo.customers'))
    EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'customers', @role_name = NULL;
GO
IF NOT EXISTS (SELECT 1 FROM cdc.change_tables WHERE source_object_id = OBJECT_ID('dbo.orders'))
    EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'orders', @role_name = NULL;
GO
