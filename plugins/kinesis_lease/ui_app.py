"""The monitoring UI: a FastAPI app the plugin mounts in the Airflow API server (at `/kinesis-lease`).

Routes (all GET, all JSON except the pages and their assets):
- `/`: the page of one application (`?application=NAME`, else the pipeline DAG's default);
- `/dag-runs/{dag_id}/{run_id}`: the page of one DAG run (the plugin's per-run view);
- `/static/{name}`: the pages' scripts and style sheets, uPlot's among them (`ASSETS`);
- `/api/default-application`: the `application_name` default of the pipeline DAG's params;
- `/api/applications/{application}`: one application's overview (`monitoring.application_document`),
  its rounds with their DAG runs' states (from Airflow's metadata database) and pages;
- `/api/applications/{application}/leases`: a page of its leases, sorted and filtered
  (`monitoring.leases_document`; `offset`, `limit` up to 1000, `sort`, `order`, `owner`, `outcome`, `q`,
  `fresh`); a parameter out of range is a 422 naming it;
- `/api/dag-runs/{dag_id}/{run_id}`: the application a run consumed as, its overview and its round.

Reads go through one `ReadsCache` per API-server process: the overviews read anew (unless
`?fresh=0`, which the page's timer sends: several open pages then share one read) and keep what
they read; a page of leases uses reads that finished up to `CACHE_SECONDS` ago, so paging through
10,000 leases scans the lease table once (`?fresh=1` reads anew). The cache is keyed by the
application and its tables.

Airflow does not authenticate plugin apps: a mount inherits none of the core API's dependencies.
So every route of this app depends on `monitoring_viewer`: Airflow's own `get_user` (the JWT of an
`Authorization: Bearer` header, else the `_token` cookie the Airflow UI sets at login), then the
auth manager's custom-view check for `MONITORING_RESOURCE`. No route bypasses FastAPI's dependencies:
no StaticFiles mount, and FastAPI's docs and OpenAPI routes are off. A run's view also needs read
access to the DAG's runs. Refused API calls get Airflow's 401/403 JSON; a refused page navigation is
redirected to the Airflow login page, which returns to the page after login.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from string import Template
from typing import Annotated, Any

import botocore.exceptions
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.models.dag import DagModel, DagTag
from airflow.models.dagbag import DBDagBag
from airflow.models.dagrun import DagRun
from airflow.models.serialized_dag import SerializedDagModel
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from kinesis_lease.aws_connection import aws_access
from kinesis_lease.monitoring import (
    MAX_PAGE,
    ROUNDS_SHOWN,
    SORT_FIELDS,
    ApplicationReads,
    LeaseQuery,
    ReadsCache,
    RunLinks,
    application_document,
    leases_document,
    owner_run,
    read_application,
    run_document,
    run_settings,
)
from kinesis_lease.plugin import PIPELINE_TAG, URL_PREFIX
from lease_core.config.settings import load_config
from lease_core.errors import AccessError, ConfigurationError, DependencyError, TableNotFoundError

MONITORING_RESOURCE = "Kinesis Lease Monitoring"
PIPELINE_DAG_ID = "kinesis_lease_pipeline"
# The connection the pipeline's operators use (their default), so the UI reads what the rounds wrote.
AWS_CONN_ID = "aws_default"
STATIC = Path(__file__).resolve().parent / "static"
ASSETS = {
    "monitoring.js": "text/javascript",
    "monitoring-charts.js": "text/javascript",
    "monitoring.css": "text/css",
    # uPlot, the charts' library, vendored (static/README.md): no CDN at run time.
    "uplot.iife.min.js": "text/javascript",
    "uplot.min.css": "text/css",
}
PAGE = Template((STATIC / "index.html").read_text(encoding="utf-8"))
CACHE_SECONDS = 5.0
READS = ReadsCache(ttl_seconds=CACHE_SECONDS)


def monitoring_viewer(user: GetUserDep) -> BaseUser:
    """The authenticated Airflow user, if the auth manager lets them see the monitoring view."""
    if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=MONITORING_RESOURCE, user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden")
    return user


app = FastAPI(
    title="Kinesis lease monitoring",
    dependencies=[Depends(monitoring_viewer)],
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


@app.get("/", response_class=HTMLResponse)
def application_page(request: Request) -> HTMLResponse:
    return _page(request, view="application")


@app.get("/dag-runs/{dag_id}/{run_id}", response_class=HTMLResponse)
def dag_run_page(request: Request, dag_id: str, run_id: str) -> HTMLResponse:
    return _page(request, view="dag-run", dag_id=dag_id, run_id=run_id)


@app.get("/static/{name}")
def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no asset {name!r}")
    return FileResponse(STATIC / name, media_type=ASSETS[name])


@app.get("/api/default-application")
def default_application(session: SessionDep, user: GetUserDep) -> dict[str, Any]:
    """The shipped DAG's application, else the first of the deployment's pipelines the user may read."""
    pipelines = _pipelines(session, user)
    shipped = [pipeline for pipeline in pipelines if pipeline["dag_id"] == PIPELINE_DAG_ID]
    chosen = (shipped or pipelines or [{"dag_id": PIPELINE_DAG_ID, "application": None}])[0]
    return {"dag_id": chosen["dag_id"], "application": chosen["application"]}


@app.get("/api/applications")
def applications(session: SessionDep, user: GetUserDep) -> dict[str, Any]:
    """The deployment's pipelines (`kinesis_lease.pipeline`) whose DAGs the user may read: each DAG
    tagged `PIPELINE_TAG` with the application its runs consume as by default, in DAG id order."""
    return {"pipelines": _pipelines(session, user)}


def _pipelines(session: Session, user: BaseUser) -> list[dict[str, Any]]:
    tagged = session.scalars(
        select(DagModel.dag_id)
        .join(DagTag, DagTag.dag_id == DagModel.dag_id)
        .where(DagTag.name == PIPELINE_TAG, DagModel.is_stale.is_(False))
        .order_by(DagModel.dag_id)
    ).all()
    readable = get_auth_manager().filter_authorized_dag_ids(dag_ids=set(tagged), user=user)
    dag_ids = [dag_id for dag_id in tagged if dag_id in readable]
    pipelines = []
    for dag_id in dag_ids:
        dag = SerializedDagModel.get_dag(dag_id, session=session)
        default = dag.params.get("application_name") if dag is not None else None
        if isinstance(default, str):
            pipelines.append({"dag_id": dag_id, "application": default})
    return pipelines


@app.get("/api/applications/{application}")
def application_overview(application: str, request: Request, session: SessionDep, fresh: bool = True) -> dict[str, Any]:
    reads = _read({"application_name": application}, fresh=fresh)
    return application_document(reads, _run_links(reads, request, session))


@app.get("/api/applications/{application}/leases")
def application_leases(
    application: str,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    sort: Annotated[str, Query(pattern=f"^({'|'.join(SORT_FIELDS)})$")] = "lease_key",
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "asc",
    owner: str | None = None,
    outcome: str | None = None,
    q: str | None = None,
    fresh: bool = False,
) -> dict[str, Any]:
    query = LeaseQuery(offset, limit, sort, order, owner, outcome, q)
    return leases_document(_read({"application_name": application}, fresh=fresh), query)


@app.get("/api/dag-runs/{dag_id}/{run_id}", dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.RUN))])
def dag_run_overview(
    dag_id: str, run_id: str, request: Request, session: SessionDep, fresh: bool = True
) -> dict[str, Any]:
    reads = _read(run_settings(_run_params(dag_id, run_id, session)), fresh=fresh)
    return run_document(dag_id, run_id, reads, _run_links(reads, request, session))


def _read(settings: dict[str, Any], fresh: bool) -> ApplicationReads:
    """The application's reads, through the cache (anew when `fresh`)."""
    config = load_config(environ=os.environ, overrides=settings)  # no AWS call: invalid settings fail here
    key = (
        config.require_application_name(),
        config.lease_table,
        config.worker_metrics_table,
        config.coordinator_state_table,
    )
    return READS.get(key, lambda: read_application(aws_access(AWS_CONN_ID, settings).app), fresh)


def _run_links(reads: ApplicationReads, request: Request, session: Session) -> RunLinks:
    """The states of the shown rounds' DAG runs, and the Airflow UI's root path (this app's mount
    path without its prefix, so that the links follow [api] base_url and a proxy prefix)."""
    run_ids = {entry["run_id"] for entry in reads.rounds[-ROUNDS_SHOWN:] if entry.get("run_id")}
    leader_run = owner_run(reads.leader.owner_name) if reads.leader is not None else None
    if leader_run is not None:
        run_ids.add(leader_run[1])
    rows: Sequence[Any] = (
        session.execute(select(DagRun.dag_id, DagRun.run_id, DagRun.state).where(DagRun.run_id.in_(run_ids))).all()
        if run_ids
        else []
    )
    states = {(dag_id, run_id): _text(state) for dag_id, run_id, state in rows}
    return RunLinks(states, str(request.scope.get("root_path", "")).removesuffix(URL_PREFIX))


def _text(state: Any) -> str | None:
    return state.value if isinstance(state, Enum) else state


def _run_params(dag_id: str, run_id: str, session: Session) -> dict[str, Any]:
    """The params the run's tasks saw: its DAG version's defaults, overridden by the run's conf."""
    run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"DAG run {run_id!r} of DAG {dag_id!r} not found")
    dag = DBDagBag().get_dag_for_run(run, session=session)
    defaults = dict(dag.params) if dag is not None else {}
    return {**defaults, **(run.conf or {})}


def _page(request: Request, *, view: str, dag_id: str = "", run_id: str = "") -> HTMLResponse:
    # The mount's root path, so the page's requests work under any [api] base_url or proxy prefix.
    fields = {"base": request.scope.get("root_path", ""), "view": view, "dag_id": dag_id, "run_id": run_id}
    return HTMLResponse(PAGE.substitute({name: html.escape(value, quote=True) for name, value in fields.items()}))


@app.exception_handler(StarletteHTTPException)
async def _refused(request: Request, error: StarletteHTTPException) -> Response:
    """Send a browser that opens a page without a session to the login page; answer everything else as JSON."""
    navigation = request.method == "GET" and "text/html" in request.headers.get("accept", "")
    if error.status_code == status.HTTP_401_UNAUTHORIZED and navigation:
        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status.HTTP_303_SEE_OTHER)
    return await http_exception_handler(request, error)


@app.exception_handler(RequestValidationError)
async def _bad_parameter(request: Request, error: RequestValidationError) -> JSONResponse:
    """A 422 naming the first parameter that is wrong, and why."""
    first = error.errors()[0]
    name = str(first["loc"][-1]) if first.get("loc") else None
    return JSONResponse(
        {"detail": f"invalid parameter {name!r}: {first.get('msg')}", "param": name},
        status.HTTP_422_UNPROCESSABLE_ENTITY,
    )


@app.exception_handler(TableNotFoundError)
async def _missing_table(request: Request, error: TableNotFoundError) -> JSONResponse:
    return JSONResponse({"detail": str(error), "table": error.table_name}, status.HTTP_404_NOT_FOUND)


@app.exception_handler(ConfigurationError)
async def _bad_setting(request: Request, error: ConfigurationError) -> JSONResponse:
    return JSONResponse({"detail": str(error), "key": error.key}, status.HTTP_422_UNPROCESSABLE_ENTITY)


@app.exception_handler(DependencyError)
@app.exception_handler(AccessError)
async def _aws_failed(request: Request, error: DependencyError | AccessError) -> JSONResponse:
    return JSONResponse(
        {"detail": str(error), "service": error.service, "operation": error.operation}, status.HTTP_502_BAD_GATEWAY
    )


@app.exception_handler(botocore.exceptions.BotoCoreError)
async def _aws_unreachable(request: Request, error: botocore.exceptions.BotoCoreError) -> JSONResponse:
    # Failures before any call is made (no credentials, no region) are not lease_core errors.
    return JSONResponse({"detail": f"AWS: {error}"}, status.HTTP_502_BAD_GATEWAY)
