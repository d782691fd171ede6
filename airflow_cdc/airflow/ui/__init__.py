"""The CDC panel in the Airflow UI: an Airflow plugin (:mod:`.plugin`) whose FastAPI app (:mod:`.app`)
serves each pipeline's lag, retained source log, staged batches and snapshot progress as JSON and as
a small HTML page (:mod:`.page`), shown as a *CDC* tab on every DAG page and a *CDC pipelines* entry
in the navigation.  The values are those of ``airflow-cdc status --json`` (:mod:`.pipelines`).
"""
