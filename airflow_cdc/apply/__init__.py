"""Applying staged batches to Delta Lake: the Spark job's submit spec, local runs, verify.

This package imports neither Airflow nor Spark at module level; the Spark code itself lives in
``spark_jobs/`` (run by ``spark-submit``).
"""
