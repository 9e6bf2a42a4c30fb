"""What `leasectl status` and the monitoring page show of the application's fan-out consumer on a stream."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# The status of a consumer Kinesis does not have (Kinesis' own are CREATING, ACTIVE and DELETING).
ABSENT = "ABSENT"


@dataclass(frozen=True)
class StreamConsumerState:
    """The consumer under the application's consumer name on one stream, and whether it is the one the
    application registered (`ours`: its ownership record names this very consumer).

    `recorded_arn` is the ARN the record names: None while a registration is under way (a claim), or
    when the application has no record for the stream; `consumer_arn` is what Kinesis has now."""

    stream_name: str
    consumer_name: str
    status: str
    consumer_arn: str | None
    created: datetime | None
    ours: bool
    recorded_arn: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "stream_name": self.stream_name,
            "consumer_name": self.consumer_name,
            "status": self.status,
            "consumer_arn": self.consumer_arn,
            "created": None if self.created is None else self.created.isoformat(timespec="seconds"),
            "ours": self.ours,
            "recorded_arn": self.recorded_arn,
        }
