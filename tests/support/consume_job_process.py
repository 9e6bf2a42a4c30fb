"""The consume job run as a user runs it: `spark-submit spark_jobs/consume_job.py` on `local[2]`, on emulators."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CONSUME_JOB = Path(__file__).resolve().parents[2] / "spark_jobs" / "consume_job.py"
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")


def submit_consume_job(
    application: str,
    stream: str,
    output_uri: str,
    report_uri: str,
    dynamodb: str,
    kinesis: str,
    workers: int = 2,
    arguments: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """One round of the consume job as a process (`arguments` go after the usual ones); its exit status
    and output are the caller's to check."""
    return subprocess.run(
        [
            str(SPARK_SUBMIT),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            str(CONSUME_JOB),
            "--application-name",
            application,
            "--stream",
            stream,
            "--workers",
            str(workers),
            "--output-uri",
            output_uri,
            "--report-uri",
            report_uri,
            "--set",
            f"aws_endpoint_url_dynamodb={dynamodb}",
            "--set",
            f"aws_endpoint_url_kinesis={kinesis}",
            "--set",
            "aws_region=us-east-1",
            *arguments,
        ],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
