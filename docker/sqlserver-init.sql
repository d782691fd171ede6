-- SQL Server sample database with CDC enabled (run once by the sqlserver-init service).
IF DB_ID('shop') IS NULL CREATE DATABASE shop;
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
IF (SELECT is_cdc_enabled FROM sys.databases WHERE name = 'shop') = 0 EXEC sys.sp_cdc_enable_db;
GO
IF NOT EXISTS (SELECT 1 FROM cdc.change_tables WHERE source_object_id = OBJECT_ID('dbo.customers'))
    EXEC sys.sp_cdc_enable_table @source_schema = N'dbo', @source_name = N'customers', @role_name = NULL;
GO
