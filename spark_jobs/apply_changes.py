"""Apply one staged airflow-cdc batch to Delta Lake (bronze change log + silver mirror).

Run with plain ``spark-submit`` (this is what ``SparkSubmitOperator`` and ``airflow-cdc apply``
do; ``airflow_cdc.apply.submit.build_apply_job`` builds the call)::

    spark-submit --packages io.delta:delta-spark_4.2_2.13:4.4.0 \\
        --py-files cdc_apply.zip spark_jobs/apply_changes.py --batch DIR --target DELTA_ROOT

Re-running it for a batch that is already (fully or partly) applied is safe and changes nothing
that is already there.  Exit code 0 on success; the last stdout line is a JSON report.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cdc_apply.job import ApplySettings, apply_batch  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", required=True, help="published batch directory (has manifest.json)")
    p.add_argument("--target", required=True, help="Delta root: <target>/<layer>/<connector>/<table>")
    p.add_argument("--delete-mode", choices=["delete", "soft"], default="delete")
    p.add_argument("--no-bronze", action="store_true", help="skip the bronze change log")
    p.add_argument(
        "--rewrite-ratio",
        type=float,
        default=ApplySettings.rewrite_ratio,
        help="rewrite a silver table instead of MERGE when events >= ratio x stored rows (0: never)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"airflow-cdc-apply {os.path.basename(args.batch)}").getOrCreate()
    settings = ApplySettings(args.delete_mode, not args.no_bronze, args.rewrite_ratio)
    report = apply_batch(spark, args.batch, args.target, settings)
    print(json.dumps(report, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
