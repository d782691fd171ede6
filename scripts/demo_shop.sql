-- Sample schema of the demo (and of the end-to-end test of the example DAG).
CREATE TABLE public.customers (
    id          integer PRIMARY KEY,
    name        text NOT NULL,
    email       text,
    created_at  timestamp NOT NULL DEFAULT '2024-01-01 00:00:00'
);
CREATE TABLE public.orders (
    id           bigint PRIMARY KEY,
    customer_id  integer NOT NULL REFERENCES public.customers (id),
    status       text NOT NULL,
    amount       numeric(12, 2) NOT NULL,
    note         text
);
INSERT INTO public.customers (id, name, email)
SELECT i, 'customer ' || i, 'c' || i || '@example.com' FROM generate_series(1, 50) AS i;
INSERT INTO public.orders (id, customer_id, status, amount, note)
SELECT i, 1 + (i % 50), (ARRAY['new', 'paid', 'shipped'])[1 + i % 3], (i * 7 % 1000) / 4.0, NULL
FROM generate_series(1, 400) AS i;
