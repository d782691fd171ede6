"""Helpers for the Airflow integration tests: the demo's sample schema, pipeline files, batch reads."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from airflow_cdc.core.batch import Batch, list_batches

ROOT = Path(__file__).resolve().parents[2]
SHOP_SQL = ROOT / "scripts" / "demo_shop.sql"
SHOP_TABLES = ["public.customers", "public.orders"]


def load_shop(db: Any) -> None:
    """Create the demo's sample schema (50 customers, 400 orders) in the test database."""
    with db.connect(autocommit=True) as conn:
        conn.execute(SHOP_SQL.read_text())


def pipeline_props(db: Any, staging: Path, **props: Any) -> dict[str, Any]:
    """Debezium properties for the test database (credentials come from the Airflow Connection)."""
    base = {
        "name": f"af_{db.name}",
        "connector": "postgresql",
        "table.include.list": ",".join(SHOP_TABLES),
        "slot.name": f"slot_{db.name}",
        "publication.name": f"pub_{db.name}",
        "staging.path": str(staging),
        "incremental.snapshot.chunk.size": 100,
    }
    base.update(props)
    return base


def direct_props(db: Any, staging: Path, **props: Any) -> dict[str, Any]:
    """Like :func:`pipeline_props` with the connection inline (for operators run without a Connection)."""
    server = db.server
    return pipeline_props(
        db,
        staging,
        **{
            "database.hostname": server.host,
            "database.port": server.port,
            "database.user": server.superuser,
            "database.password": server.password,
            "database.dbname": db.name,
            **props,
        },
    )


def write_pipeline(path: Path, props: dict[str, Any], airflow: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({**props, "airflow": airflow}, sort_keys=False))
    return path


def metastore_url(db: Any, table: str = "cdc_state") -> str:
    s = db.server
    return f"postgresql://{s.superuser}:{s.password}@{s.host}:{s.port}/{db.name}?table={table}"


def newest_batch(staging: Path, name: str) -> Batch:
    return list_batches(staging, name)[-1]


def batch_rows(batch: Batch, table: str) -> list[dict[str, Any]]:
    """All events of ``table`` in ``batch`` as dicts (op, after, ...)."""
    if table not in batch.manifest["tables"]:
        return []
    out: list[dict[str, Any]] = []
    for part in batch.parts(table):
        out.extend(pq.read_table(part).to_pylist())
    return out


class Writer(threading.Thread):
    """Random inserts, updates and deletes on the sample schema until stopped (bounded in count)."""

    def __init__(self, db: Any, seed: int, max_ops: int = 5000, pause: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.db, self.rng, self.max_ops, self.pause = db, random.Random(seed), max_ops, pause
        self.stop_event = threading.Event()
        self.ops = 0
        self.next_id = 100_000 + seed * 100_000

    def run(self) -> None:
        with self.db.connect(autocommit=True) as conn:
            while not self.stop_event.is_set() and self.ops < self.max_ops:
                self.step(conn)
                self.ops += 1
                time.sleep(self.pause)

    def step(self, conn: Any) -> None:
        r = self.rng.random()
        if r < 0.4:
            self.next_id += 1
            conn.execute(
                "INSERT INTO public.orders (id, customer_id, status, amount, note) VALUES (%s, %s, 'new', %s, %s)",
                (self.next_id, self.rng.randint(1, 50), self.rng.randint(1, 99999) / 100, f"w{self.ops}"),
            )
        elif r < 0.8:
            conn.execute(
                "UPDATE public.orders SET status = %s, amount = amount + 1 WHERE id = "
                "(SELECT id FROM public.orders ORDER BY random() LIMIT 1)",
                (self.rng.choice(["paid", "shipped", "returned"]),),
            )
        elif r < 0.9:
            conn.execute(
                "UPDATE public.customers SET email = %s WHERE id = %s",
                (f"x{self.ops}@example.com", self.rng.randint(1, 50)),
            )
        else:
            conn.execute(
                "DELETE FROM public.orders WHERE id = (SELECT id FROM public.orders ORDER BY random() LIMIT 1)"
            )

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=30)
