"""A new user's pipelines, as the README leads them to write them: a DAG file of their own, outside the
repository, with two pipelines on two streams, each decoding JSON with the user's own code (shipped
with the job, nowhere else on a path) and setting bad records aside; and the checks of what landed.

Each stream gets `VALID` events and one record the decoder rejects: broken JSON on the orders stream,
an event whose id is not a number (its row does not fit the decoder's schema) on the clicks stream.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.leader.round_history import RoundHistory
from lease_core.store.coordinator_state import CoordinatorStateStore
from sinks.dead_lettering import dead_letter_uri
from sinks.parquet import ParquetSink
from tests.support.stores import dynamodb_state_store

VALID = 20

USERS_CODE = '''
"""The user's code: JSON order events to typed columns, and a batch transform."""
import json

import pyarrow as pa
import pyarrow.compute as pc


def decode(data, record):
    event = json.loads(data)
    return {"order_id": event["id"], "amount": event["amount"], "shard": record.shard_id}


decode.schema = pa.schema([("order_id", pa.int64()), ("amount", pa.float64()), ("shard", pa.string())])


def flag_large(table):
    return table.append_column("large", pc.greater(table.column("amount"), 20.0))
'''

USERS_DAG_FILE = '''
"""Two pipelines, one per stream, each with its own application, output and processing."""
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

orders: DAG = kinesis_pipeline(
    "{orders}_to_lake",
    streams=["{orders}"],
    application_name="{orders}",
    output_uri="{lake}/orders",
    schedule=None,
    num_workers=2,
    initial_position="TRIM_HORIZON",
    decode="users_code:decode",
    bad_records="dead_letter",
    py_files="{code}",
    settings={{"max_leases_for_worker": 8}},
)
clicks: DAG = kinesis_pipeline(
    "{clicks}_to_lake",
    streams=["{clicks}"],
    application_name="{clicks}",
    output_uri="{lake}/clicks",
    schedule=None,
    num_workers=1,
    initial_position="TRIM_HORIZON",
    decode="users_code:decode",
    transform="users_code:flag_large",
    bad_records="dead_letter",
    py_files="{code}",
)
'''

# The record each stream's decoder rejects, and what its dead letter's error says.
MALFORMED = {
    "orders": (b'{"id": 999, "amount": ', "JSONDecodeError"),
    "clicks": (b'{"id": "x", "amount": 1}', "does not fit its schema"),
}


@dataclass(frozen=True)
class UsersPipelines:
    folder: Path  # the user's DAG folder (a DAG bundle of its own), beside their code
    lake: Path
    streams: dict[str, str]  # "orders" / "clicks" -> the stream (and application) name
    kinesis_endpoint: str
    moto_endpoint: str

    @classmethod
    def create(cls, root: Path, token: str, kinesis_endpoint: str, moto_endpoint: str) -> UsersPipelines:
        """The user's folders and files under `root`, and their two streams with records on them."""
        streams = {"orders": f"{token}-o", "clicks": f"{token}-c"}
        folder, code = root / "dags", root / "code" / "users_code.py"
        folder.mkdir(parents=True)
        code.parent.mkdir()
        code.write_text(USERS_CODE)
        dag_file = USERS_DAG_FILE.format(lake=root / "lake", code=code, **streams)
        (folder / "users_pipelines.py").write_text(textwrap.dedent(dag_file))
        users = cls(folder, root / "lake", streams, kinesis_endpoint, moto_endpoint)
        kinesis = kinesis_client(kinesis_endpoint)
        for name, stream in streams.items():
            create_stream(kinesis, stream, 2 if name == "orders" else 1)
            for payload in users.payloads(name):
                kinesis.put_record(StreamName=stream, Data=payload, PartitionKey=payload.decode()[:16])
        return users

    @staticmethod
    def payloads(name: str) -> list[bytes]:
        valid = [json.dumps({"id": n, "amount": n * 1.5}).encode() for n in range(1, VALID + 1)]
        return [*valid[: VALID // 2], MALFORMED[name][0], *valid[VALID // 2 :]]

    @property
    def dag_ids(self) -> list[str]:
        return [f"{stream}_to_lake" for stream in self.streams.values()]

    def bundle(self) -> dict[str, str]:
        """The user's DAG folder as a DAG bundle (`AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST`)."""
        return {
            "name": "users-dags",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(self.folder)},
        }

    def check_landed(self) -> None:
        """Every valid event once in its pipeline's output, with its processing's columns; the rejected
        record once in the dead letters beside it, with its error; the round in its own history."""
        for name, stream in self.streams.items():
            output = str(self.lake / name)
            landed = ParquetSink.from_uri(output).read_dataset()
            rows = sorted(landed.select(["order_id", "amount"]).to_pylist(), key=lambda row: row["order_id"])
            assert rows == [{"order_id": n, "amount": n * 1.5} for n in range(1, VALID + 1)], name
            assert ("large" in landed.column_names) == (name == "clicks"), "each pipeline ran its own transform"
            dead = ParquetSink.from_uri(dead_letter_uri(output)).read_dataset().to_pylist()
            assert [row["data"] for row in dead] == [MALFORMED[name][0]], name
            assert MALFORMED[name][1] in dead[0]["error"] and dead[0]["stream_name"] == stream
            history = RoundHistory(self._coordinator_state(stream)).rounds()
            assert sum(entry["dead_lettered"] or 0 for entry in history) == 1, history
            assert {entry["dag_id"] for entry in history} == {f"{stream}_to_lake"}

    def applications(self) -> set[str]:
        return set(self.streams.values())

    def _coordinator_state(self, application: str) -> CoordinatorStateStore:
        return dynamodb_state_store(self.moto_endpoint, application)
