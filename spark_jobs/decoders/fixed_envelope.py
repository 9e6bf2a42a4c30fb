"""What the built-in decoders of a fixed envelope share: they take no options, and their columns are
the batch's positions and the envelope's own (`ENVELOPE_SCHEMA`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import pyarrow as pa

from sinks.record_columns import POSITION_SCHEMA


class FixedEnvelopeDecoder:
    spec: str  # the decoder's name, the dataclass field of each decoder
    ENVELOPE_SCHEMA: ClassVar[pa.Schema]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Self:
        if options:
            raise ValueError(f"the {cls.spec} decoder takes no options, got {sorted(options)}")
        return cls()

    def options(self) -> dict[str, Any]:
        return {}

    def columns(self) -> pa.Schema:
        return pa.schema([*POSITION_SCHEMA, *self.ENVELOPE_SCHEMA])
