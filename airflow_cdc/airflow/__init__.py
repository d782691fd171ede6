"""The Airflow provider: thin adapters (hooks, operators, sensors, triggers, a DAG factory) over the core.

Nothing here holds CDC logic: capture, commit and state live in :mod:`airflow_cdc.core`, the source
clients in :mod:`airflow_cdc.sources`, the Spark job description in :mod:`airflow_cdc.apply`.
Importing this package itself imports no Airflow module (``get_provider_info`` must stay cheap).
"""
