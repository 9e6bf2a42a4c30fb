"""The `LoadProbes` coordinator-state record: the sync step's load probes of leases never measured
(docs/protocol.md §6), kept for the round's assignment, which reads them (§4.2)."""

from __future__ import annotations

from collections.abc import Mapping

from lease_core.store.compressed_json import compress_map, decompress_map
from lease_core.store.coordinator_state import CoordinatorStateStore, update_record
from lease_core.store.record_table import Record

LOAD_PROBES_KEY = "LoadProbes"
PROBES = "probesZ"  # lease key -> KB/s, compressed (store/compressed_json.py says why)


def record_load_probes(state: CoordinatorStateStore, probes: Mapping[str, float], now_millis: int) -> None:
    """Keep the round's probes for its assignment, replacing the last round's; no probes where none
    were kept costs no write."""

    def change(record: Record | None) -> Record | None:
        if not probes and not load_probes_of(record):
            return None
        return {"probedAt": now_millis, PROBES: compress_map(probes)}

    update_record(state, LOAD_PROBES_KEY, change)


def load_probes_of(record: Record | None) -> dict[str, float]:
    if record is None or PROBES not in record:
        return {}
    return {key: float(value) for key, value in decompress_map(bytes(record[PROBES])).items()}
