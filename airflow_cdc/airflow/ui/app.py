"""The CDC panel's FastAPI app, mounted by the api-server under ``/cdc`` (:mod:`.plugin`).

Airflow authenticates none of a plugin's routes by itself: each route here depends on Airflow's own
security dependencies, so the caller needs what the DAG pages need -- the UI's session cookie (the
iframe sends it) or an API token (``Authorization: Bearer``), and read access to the DAG
(``requires_access_dag("GET")``); the all-pipelines routes show only the DAGs the user may read.
Routes are plain functions: FastAPI runs them in its thread pool, off the event loop.
"""

from __future__ import annotations

from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, Query
from fastapi.responses import HTMLResponse

from airflow_cdc.airflow.ui.page import render
from airflow_cdc.airflow.ui.pipelines import dag_documents

app = FastAPI(title="airflow-cdc pipelines", description="Lag, retained log and snapshot progress.")
CanReadDag = Depends(requires_access_dag("GET"))
#: ``?live=0``: only the saved values (no connection to any source)
Live = Annotated[bool, Query(description="Read the retained log from each source now.")]


def _readable_dags(user: Any) -> set[str]:
    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


@app.get("/api/dags/{dag_id}", dependencies=[CanReadDag])
def dag_status(dag_id: str, live: Live = True) -> dict[str, Any]:
    """The status documents of the DAG's pipelines (one per capture task / partition)."""
    return dag_documents([dag_id], live)


@app.get("/api/dags")
def all_status(user: GetUserDep, live: Live = True) -> dict[str, Any]:
    """The status documents of every pipeline whose DAG the user may read."""
    return dag_documents(_readable_dags(user), live)


@app.get("/dags/{dag_id}", response_class=HTMLResponse, dependencies=[CanReadDag])
def dag_page(dag_id: str, live: Live = True) -> str:
    """The DAG's *CDC* tab."""
    return render(f"CDC pipeline of {dag_id}", dag_documents([dag_id], live))


@app.get("/", response_class=HTMLResponse)
def all_page(user: GetUserDep, live: Live = True) -> str:
    """The *CDC pipelines* page: every pipeline whose DAG the user may read."""
    return render("CDC pipelines", dag_documents(_readable_dags(user), live), link_dag=True)
