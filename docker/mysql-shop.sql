-- MySQL sample schema (loaded by the mysql service on first start).
CREATE TABLE customers (id INT PRIMARY KEY, name VARCHAR(200) NOT NULL, email VARCHAR(200));
CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id INT NOT NULL, status VARCHAR(20) NOT NULL,
                     amount DECIMAL(12, 2) NOT NULL, note TEXT);
INSERT INTO customers (id, name, email) VALUES (1, 'customer 1', 'c1@example.com'), (2, 'customer 2', NULL);
INSERT INTO orders VALUES (1, 1, 'new', 10.00, NULL), (2, 2, 'paid', 20.50, 'gift');
GRANT SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdc'@'%';
