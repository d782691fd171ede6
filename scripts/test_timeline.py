"""Where a test run's wall time went, from the lines ``AIRFLOW_CDC_TEST_TIMELINE=<dir>`` made.

    python scripts/test_timeline.py <dir> [--top N]

Prints each worker's busy time and idle gaps, the tail (how long the last worker ran alone), the
files by their summed time, and the slowest tests.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {}
    for path in sorted(args.folder.glob("*.jsonl")):
        runs[path.stem] = [json.loads(line) for line in path.read_text().splitlines() if line]
    t0 = min(r["start"] for rows in runs.values() for r in rows)
    t1 = max(r["end"] for rows in runs.values() for r in rows)
    print(f"span {t1 - t0:.0f} s over {len(runs)} workers")
    ends = sorted(max(r["end"] for r in rows) for rows in runs.values())
    if len(ends) > 1:
        print(f"tail: the last worker ran alone for {ends[-1] - ends[-2]:.0f} s")
    for worker, rows in runs.items():
        busy = sum(r["end"] - r["start"] for r in rows)
        done = max(r["end"] for r in rows) - t0
        print(f"{worker}: {len(rows)} tests, busy {busy:.0f} s, done at +{done:.0f} s")
    per_file: dict[str, float] = defaultdict(float)
    worker_of: dict[str, str] = {}
    for worker, rows in runs.items():
        for r in rows:
            name = r["test"].split("::")[0]
            per_file[name] += r["end"] - r["start"]
            worker_of[name] = worker
    print("\nfiles by time:")
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.0f} s  {worker_of[name]:5}  {name}")
    print("\nslowest tests:")
    tests = [(r["end"] - r["start"], w, r["test"], r["start"] - t0) for w, rows in runs.items() for r in rows]
    for seconds, worker, name, at in sorted(tests, reverse=True)[: args.top]:
        print(f"{seconds:8.0f} s  {worker:5} at +{at:5.0f}  {name}")


if __name__ == "__main__":
    main()
