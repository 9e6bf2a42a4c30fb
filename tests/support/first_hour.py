"""A data engineer's first hour, as the README's "Your own pipelines" walk-through leads them: a folder of
their own outside the repository with their code and a DAG file of two pipelines, and the checks of
what each step should have left behind.

- `clicks`: JSON click events decoded by the user's decoder into an Iceberg table on a SQLite catalog
  (`lake`, configured by pyiceberg's environment variables), bad records into the dead letters beside it.
  Two bad records: one a fixed decoder can read (`click 7 /home`), one nothing can (bytes of garbage).
- `orders`: KPL-aggregated JSON orders, a batch transform that parses them, into a local Delta folder;
  the stream is split between rounds and a backfill re-reads a time window into a table of its own.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog

from tests.support.iceberg_tables import catalog_environment
from tests.support.kpl import put_aggregate

CATALOG = "lake"
NAMESPACE = "web"
CLICKS = 12  # valid click events, before and after the two bad records
ORDERS_PER_AGGREGATE = 5

USERS_CODE = '''
"""The user's code: click events to typed columns, their replay, and a transform of orders."""
import json

import pyarrow as pa


def decode_click(data, record):
    event = json.loads(data)
    return {"click_id": event["id"], "page": event["page"]}


decode_click.schema = pa.schema([("click_id", pa.int64()), ("page", pa.string())])


def replay_click(data, record):
    """The fixed decoder for the dead letters: reads `click N PAGE` too, and gives up on garbage."""
    text = data.decode("utf-8", errors="replace")
    if text.startswith("click "):
        _, number, page = text.split(" ", 2)
        return {"click_id": int(number), "page": page}
    if not text.startswith("{"):
        return None
    return decode_click(data, record)


replay_click.schema = decode_click.schema


def order_columns(table):
    orders = [json.loads(data) for data in table.column("data").to_pylist()]
    return (
        table.drop_columns(["data"])
        .append_column("order_id", pa.array([order["id"] for order in orders], pa.int64()))
        .append_column("amount", pa.array([order["amount"] for order in orders], pa.float64()))
    )
'''

USERS_DAG_FILE = '''
"""The user's two pipelines."""
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

clicks: DAG = kinesis_pipeline(
    "clicks_to_lake",
    streams=["{clicks}"],
    application_name="{clicks}",
    output_uri="iceberg://{catalog}/{namespace}.clicks",
    schedule=None,
    num_workers=1,
    initial_position="TRIM_HORIZON",
    decode="users_code:decode_click",
    bad_records="dead_letter",
    py_files="{code}",
)
orders: DAG = kinesis_pipeline(
    "orders_to_lake",
    streams=["{orders}"],
    application_name="{orders}",
    output_uri="delta:{lake}/orders",
    schedule=None,
    num_workers=2,
    initial_position="TRIM_HORIZON",
    transform="users_code:order_columns",
    py_files="{code}",
)
'''

# Mistakes a newcomer makes, each in a DAG file of its own (a file that fails to import takes every
# pipeline in it along): the pipeline's arguments.
MISTAKES = {
    "misspelled_setting": 'settings={"max_leases_for_workr": 8}, output_uri="delta:{lake}/typo"',
    "unconfigured_catalog": 'output_uri="iceberg://nowhere/web.clicks", initial_position="TRIM_HORIZON"',
}
MISTAKE_DAG_FILE = """
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

mistake: DAG = kinesis_pipeline(
    "{name}", streams=["{stream}"], application_name="{name}", schedule=None, {arguments}
)
"""


def click_payloads(first: int, count: int) -> list[bytes]:
    return [json.dumps({"id": n, "page": f"/page/{n}"}).encode() for n in range(first, first + count)]


BAD_CLICKS = (b"click 7000 /home", b"\x00\x01garbage")


def order(n: int) -> bytes:
    return json.dumps({"id": n, "amount": n * 2.5}).encode()


@dataclass(frozen=True)
class FirstHour:
    root: Path  # the user's folder, outside the repository
    dags: Path  # their DAG files' folder ($AIRFLOW_HOME/dags)
    clicks: str  # stream and application names
    orders: str

    @classmethod
    def create(cls, root: Path, dags: Path, token: str) -> FirstHour:
        """The user's code and catalog folder under `root`, their DAG files in `dags` (no stream yet)."""
        hour = cls(root, dags, f"{token}-clicks", f"{token}-orders")
        hour.dags.mkdir(parents=True)
        hour.code.parent.mkdir(parents=True)
        hour.lake.mkdir()
        hour.code.write_text(USERS_CODE)
        dag_file = USERS_DAG_FILE.format(
            clicks=hour.clicks, orders=hour.orders, catalog=CATALOG, namespace=NAMESPACE, lake=hour.lake, code=hour.code
        )
        (hour.dags / "users_pipelines.py").write_text(textwrap.dedent(dag_file))
        for name, arguments in MISTAKES.items():
            mistake = MISTAKE_DAG_FILE.format(
                name=name, stream=hour.clicks, arguments=arguments.replace("{lake}", str(hour.lake))
            )
            (hour.dags / f"{name}.py").write_text(textwrap.dedent(mistake))
        return hour

    @property
    def code(self) -> Path:
        return self.root / "code" / "users_code.py"

    @property
    def lake(self) -> Path:
        return self.root / "lake"

    def catalog_environment(self) -> dict[str, str]:
        """The Iceberg catalog `lake` as the user configures it: pyiceberg's environment variables."""
        properties = {"type": "sql", "uri": f"sqlite:///{self.lake}/catalog.db", "warehouse": f"file://{self.lake}"}
        return catalog_environment(CATALOG, properties)

    # --- producing -----------------------------------------------------------------------------

    def produce_clicks(self, kinesis: Any) -> None:
        """Half the valid clicks, the two bad records, the other half."""
        valid = click_payloads(1, CLICKS)
        for payload in [*valid[: CLICKS // 2], *BAD_CLICKS, *valid[CLICKS // 2 :]]:
            kinesis.put_record(StreamName=self.clicks, Data=payload, PartitionKey="visitor")

    def produce_orders(self, kinesis: Any, numbers: range) -> None:
        """The orders as KPL aggregates of a few each, spread over the hash key space by partition key."""
        chunks = [numbers[i : i + ORDERS_PER_AGGREGATE] for i in range(0, len(numbers), ORDERS_PER_AGGREGATE)]
        for chunk in chunks:
            put_aggregate(kinesis, self.orders, [(f"customer-{n}", order(n)) for n in chunk])

    # --- what landed ---------------------------------------------------------------------------

    def clicks_table(self, name: str = "clicks") -> pa.Table:
        catalog = load_catalog(CATALOG, **_catalog_properties(self.catalog_environment()))
        return catalog.load_table(f"{NAMESPACE}.{name}").scan().to_arrow()

    def orders_table(self, uri: str | None = None) -> pa.Table:
        return DeltaTable(uri or str(self.lake / "orders")).to_pyarrow_table()


def _catalog_properties(environment: dict[str, str]) -> dict[str, str]:
    prefix = f"PYICEBERG_CATALOG__{CATALOG.upper()}__"
    return {name.removeprefix(prefix).lower(): value for name, value in environment.items()}


def sorted_column(table: pa.Table, name: str) -> list[Any]:
    return sorted(table.column(name).to_pylist())
