"""``airflow-cdc`` command line: run captures and inspect state without Airflow.

airflow-cdc capture --config pipeline.yaml [--commit] [--signal JSON]...
airflow-cdc commit  --config pipeline.yaml --batch DIR
airflow-cdc status  --config pipeline.yaml
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from airflow_cdc.core.batch import Batch, list_batches
from airflow_cdc.core.errors import CdcError
from airflow_cdc.core.pipeline import build_capture, build_config, read_pipeline_file


def _print(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True, default=str))


def cmd_capture(args: argparse.Namespace) -> int:
    capture = build_capture(read_pipeline_file(args.config))
    result = capture.run(signals=[json.loads(s) for s in args.signal], commit=args.commit)
    _print(
        {
            "batch_id": result.batch_id,
            "batch_path": result.batch_path,
            "from_offset": result.from_offset,
            "to_offset": result.to_offset,
            "events": result.events,
            "snapshot_rows": result.snapshot_rows,
            "tables": result.tables,
            "notes": result.notes,
            "committed": result.committed,
        }
    )
    return 0


def cmd_commit(args: argparse.Namespace) -> int:
    capture = build_capture(read_pipeline_file(args.config))
    version = capture.commit(Batch(args.batch))
    _print({"committed": args.batch, "state_version": version})
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    config = build_config(read_pipeline_file(args.config))
    capture = build_capture(config)
    stored = capture.store.load(config["name"])
    batches = list_batches(config["staging.path"], config["name"])
    _print(
        {
            "connector": config["name"],
            "state_store": capture.store.describe(),
            "state_version": stored.version if stored else None,
            "updated_at": stored.updated_at if stored else None,
            "state": stored.data if stored else None,
            "staged_batches": len(batches),
            "newest_batch": batches[-1].batch_id if batches else None,
        }
    )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="airflow-cdc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="capture one change window (and snapshot chunks) into a staged batch")
    c.add_argument("--config", required=True, help="pipeline file (YAML/JSON of Debezium properties)")
    c.add_argument("--commit", action="store_true", help="commit the batch right away (no apply step)")
    c.add_argument(
        "--signal",
        action="append",
        default=[],
        help="execute-snapshot / stop-snapshot signal as JSON, e.g. "
        '\'{"type":"execute-snapshot","data":{"data-collections":["public.t"]}}\'',
    )
    c.set_defaults(func=cmd_capture)
    m = sub.add_parser("commit", help="commit a staged batch: store its end offset, acknowledge the source")
    m.add_argument("--config", required=True)
    m.add_argument("--batch", required=True, help="batch directory")
    m.set_defaults(func=cmd_commit)
    s = sub.add_parser("status", help="show the stored state and staged batches")
    s.add_argument("--config", required=True)
    s.set_defaults(func=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return args.func(args)
    except CdcError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
