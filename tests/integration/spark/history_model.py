"""An independent, plain-Python model of SCD type 2 history, and random change sequences.

The model walks every event of the table in position order (whatever order the batches were
applied in): an upsert opens a version when its key has none or a tracked column differs from the
current version, else it updates the current version in place; a delete or truncate closes it.
An unchanged-TOAST column (not sent) keeps the key's value from its previous upsert since its last
delete.  Nothing here imports the apply job.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

UNSENT = object()  # a value the source did not send (PostgreSQL's unchanged TOAST)
COLUMNS = ("id", "a", "b", "x")  # id: key; a, b: tracked; x: excluded from tracking (in place)


@dataclass
class Event:
    pos: int
    op: str  # r, c, u, d, t (truncate); a key change is a d of the old key and a c with ``old``
    key: int | None = None
    values: dict[str, Any] | None = None
    old: int | None = None  # the old key of a key change's c

    @property
    def ts_ms(self) -> int:
        return 1_700_000_000_000 + self.pos * 1000


@dataclass
class Version:
    key: int
    values: dict[str, Any]
    start: int
    end: int | None = None
    start_ts: int = 0
    end_ts: int | None = None

    def row(self) -> tuple:
        return (
            self.key,
            self.values["a"],
            self.values["b"],
            self.values["x"],
            self.start,
            self.end,
            self.start_ts,
            self.end_ts,
            self.end is None,
        )


@dataclass
class Model:
    tracked: tuple[str, ...] = ("a", "b")
    versions: list[Version] = field(default_factory=list)
    current: dict[int, Version] = field(default_factory=dict)
    last: dict[int, dict[str, Any]] = field(default_factory=dict)  # values since the last delete
    in_place: int = 0  # upserts that changed only untracked columns of a current version
    reopened: int = 0  # versions opened for a key that had a closed one (re-inserts)

    def close(self, key: int, event: Event) -> None:
        version = self.current.pop(key, None)
        if version is not None:
            version.end, version.end_ts = event.pos, event.ts_ms
        self.last.pop(key, None)

    def upsert(self, event: Event, key: int, sent: dict[str, Any]) -> None:
        earlier = self.last.get(key, {})
        values = {c: (earlier.get(c) if v is UNSENT else v) for c, v in sent.items()}
        cur = self.current.get(key)
        if cur is not None and all(cur.values[c] == values[c] for c in self.tracked):
            self.in_place += cur.values != values
            cur.values = values
        else:
            if cur is not None:
                cur.end, cur.end_ts = event.pos, event.ts_ms
            elif any(v.key == key for v in self.versions):
                self.reopened += 1
            cur = self.current[key] = Version(key, values, event.pos, start_ts=event.ts_ms)
            self.versions.append(cur)
        self.last[key] = values

    def apply(self, events: list[Event]) -> Model:
        for e in sorted(events, key=lambda e: e.pos):
            if e.op == "t":
                for key in list(self.current):
                    self.close(key, e)
                self.last.clear()
            elif e.op == "d":
                self.close(e.key, e)  # type: ignore[arg-type]
            else:
                self.upsert(e, e.key, e.values)  # type: ignore[arg-type]
        return self

    def seeded(self, events: list[Event]) -> Model:
        """History enabled once ``events`` were applied to silver: each key live after them gets
        one version from its last event's position (its start time: unknown, ``None``)."""
        before = Model(self.tracked).apply(events)
        last = {e.key: e for e in sorted(events, key=lambda e: e.pos) if e.op in ("r", "c", "u")}
        for key, values in before.current_rows().items():
            version = Version(key, dict(values), last[key].pos, start_ts=None)  # type: ignore[arg-type]
            self.versions.append(version)
            self.current[key] = version
            self.last[key] = dict(before.last[key])
        return self

    def rows(self) -> list[tuple]:
        return sorted((v.row() for v in self.versions), key=repr)

    def current_rows(self) -> dict[int, dict[str, Any]]:
        return {k: v.values for k, v in self.current.items()}


def random_events(
    seed: int, n: int = 240, keys: int = 40, toast: bool = True, snapshot: int = 12
) -> list[Event]:
    """A random change sequence: ``snapshot`` snapshot rows (``r``), then inserts, updates (some
    only of ``x``, some of nothing, some with ``b`` unsent), deletes, re-inserts of deleted keys,
    key changes (sent whole, as with ``REPLICA IDENTITY FULL``), and a truncate."""
    rng = random.Random(seed)
    live: dict[int, dict[str, Any]] = {}
    out: list[Event] = []
    pos = 0
    for key in rng.sample(range(1, keys + 1), snapshot):
        pos += 2
        live[key] = {"id": key, "a": rng.randrange(3), "b": rng.choice("pq"), "x": f"x{rng.randrange(99)}"}
        out.append(Event(pos, "r", key, dict(live[key])))
    truncate_at = rng.randrange(n // 3, n)
    truncated = False

    def values(key: int, base: dict[str, Any] | None = None) -> dict[str, Any]:
        v = dict(
            base or {"id": key, "a": rng.randrange(3), "b": rng.choice("pq"), "x": f"x{rng.randrange(99)}"}
        )
        v["id"] = key
        for c, new in (("a", rng.randrange(3)), ("b", rng.choice("pq")), ("x", f"x{rng.randrange(99)}")):
            if base is not None and rng.random() < 0.45:
                v[c] = new
        return v

    while len(out) < n:
        pos += 2  # room for a key change's two events
        roll = rng.random()
        if len(out) >= truncate_at and not truncated:
            out.append(Event(pos, "t"))
            live.clear()
            truncated = True
        elif not live or roll < 0.3:
            key = rng.choice([k for k in range(1, keys + 1) if k not in live] or [keys + pos])
            live[key] = values(key)
            out.append(Event(pos, "c", key, dict(live[key])))
        elif roll < 0.75:
            key = rng.choice(sorted(live))
            old_b = live[key]["b"]
            live[key] = values(key, live[key])
            sent = dict(live[key])
            if toast and rng.random() < 0.25:
                live[key]["b"] = old_b  # unchanged, so not sent: the stored value stays
                sent["b"] = UNSENT
            out.append(Event(pos, "u", key, sent))
        elif roll < 0.88:
            key = rng.choice(sorted(live))
            del live[key]
            out.append(Event(pos, "d", key))
        else:
            old = rng.choice(sorted(live))
            free = [k for k in range(1, keys + 1) if k not in live]
            if not free:
                continue
            new = rng.choice(free)
            live[new] = {**live.pop(old), "id": new}
            out.append(Event(pos, "d", old))
            out.append(Event(pos + 1, "c", new, dict(live[new]), old=old))
    return out
