"""Sample user decoders, named in tests by specs such as "tests.support.decoders:amounts".

The payloads are orders' amounts: `{"amount": 7}` as the pipeline expects them, and two forms a
producer sent by mistake, `amount=7` and `amount:7`. The pipeline's decoder reads JSON only; a
first fix reads `amount=7` too, the full fix both forms.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from spark_jobs.decode import RecordContext

SCHEMA = pa.schema([pa.field("amount", pa.int64())])


def json_amounts(data: bytes, record: RecordContext) -> Mapping[str, Any]:
    return {"amount": json.loads(data)["amount"]}


def amounts_with_equals(data: bytes, record: RecordContext) -> Mapping[str, Any]:
    text = data.decode()
    if text.startswith("amount="):
        return {"amount": int(text.removeprefix("amount="))}
    return json_amounts(data, record)


def amounts(data: bytes, record: RecordContext) -> Mapping[str, Any]:
    return amounts_with_equals(data.replace(b"amount:", b"amount="), record)


def amounts_or_give_up(data: bytes, record: RecordContext) -> Mapping[str, Any] | None:
    """A replay's decoder for a batch that mixes records a fix can land with one no fix can: it lands
    `amount=7` and leaves `amount:7` out on purpose."""
    if data.startswith(b"amount:"):
        return None
    return amounts_with_equals(data, record)


for _decoder in (json_amounts, amounts_with_equals, amounts, amounts_or_give_up):
    _decoder.schema = SCHEMA  # type: ignore[attr-defined]
