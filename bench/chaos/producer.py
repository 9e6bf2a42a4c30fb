"""The producer: a thread that writes records with unique payloads the whole campaign, and its ledger.

It writes straight to kinesis-mock (never through the fault proxy: the faults are the consumer's),
at a bounded rate (kinesis-mock takes ~2,000 puts/s and the machine has two cores). Half of the
records go to three hot partition keys, so the shards' loads are skewed. Nothing about it is
random: the payload and key of record n are functions of n.

The ledger holds what Kinesis acknowledged: (shard, sequence number) -> payload. A PutRecords call
that raised may or may not have written its records; their payloads are kept as `uncertain` (a
record landed with such a payload is not an unexpected one) and they are written again under new
serial numbers.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

PUT_RECORDS_LIMIT = 500
HOT_KEYS = 3


@dataclass(frozen=True)
class ProducedRecord:
    shard_id: str
    sequence_number: str
    payload: bytes
    written_at: float  # time.monotonic() when acknowledged


class Producer:
    def __init__(self, kinesis: Any, stream: str, label: str, records_per_second: float) -> None:
        self._kinesis = kinesis
        self._stream = stream
        self._label = label
        self._rate = records_per_second
        self._serial = 0
        self._lock = threading.Lock()
        self._records: list[ProducedRecord] = []
        self.uncertain: set[bytes] = set()
        self.errors = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)

    def records(self) -> list[ProducedRecord]:
        with self._lock:
            return list(self._records)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def _run(self) -> None:
        period = 0.25
        per_tick = max(1, round(self._rate * period))
        next_tick = time.monotonic()
        while not self._stopping.is_set():
            self._put([self._next_entry() for _ in range(per_tick)])
            next_tick += period
            self._stopping.wait(max(0.0, next_tick - time.monotonic()))

    def _next_entry(self) -> dict[str, Any]:
        serial = self._serial
        self._serial += 1
        key = f"hot-{serial % HOT_KEYS}" if serial % 2 == 0 else f"key-{serial}"
        return {"Data": f"chaos/{self._label}/{serial:09d}".encode(), "PartitionKey": key}

    def _put(self, pending: list[dict[str, Any]]) -> None:
        while pending and not self._stopping.is_set():
            batch, pending = pending[:PUT_RECORDS_LIMIT], pending[PUT_RECORDS_LIMIT:]
            try:
                results = self._kinesis.put_records(StreamName=self._stream, Records=batch)["Records"]
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                self.errors += 1
                with self._lock:
                    self.uncertain.update(entry["Data"] for entry in batch)
                pending = [self._next_entry() for _ in batch] + pending
                time.sleep(0.2)
                continue
            now = time.monotonic()
            refused = []
            with self._lock:
                for entry, result in zip(batch, results):
                    if "ErrorCode" in result:
                        refused.append(entry)
                    else:
                        self._records.append(
                            ProducedRecord(result["ShardId"], result["SequenceNumber"], entry["Data"], now)
                        )
            if refused:
                time.sleep(0.05)
                pending = refused + pending
