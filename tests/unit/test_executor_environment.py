"""The consume job hands the driver's AWS credentials and region to executors started by cluster workers."""

from __future__ import annotations

import pytest

from spark_jobs.consume_job import executor_environment


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cret", "AWS_DEFAULT_REGION": "eu-west-1"},
            {
                "spark.executorEnv.AWS_ACCESS_KEY_ID": "AKIA1",
                "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "s3cret",
                "spark.executorEnv.AWS_DEFAULT_REGION": "eu-west-1",
            },
            id="keys-and-region",
        ),
        pytest.param(
            {"AWS_ACCESS_KEY_ID": "ASIA1", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"},
            {
                "spark.executorEnv.AWS_ACCESS_KEY_ID": "ASIA1",
                "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "s",
                "spark.executorEnv.AWS_SESSION_TOKEN": "t",
            },
            id="temporary-credentials-keep-their-token",
        ),
        pytest.param(
            {"AWS_PROFILE": "prod", "AWS_CONFIG_FILE": "/home/me/.aws/config"}, {}, id="profiles-stay-on-the-driver"
        ),
        pytest.param({"AWS_ACCESS_KEY_ID": "", "PATH": "/usr/bin"}, {}, id="empty-and-unrelated-ignored"),
    ],
)
def test_only_credentials_and_region_are_forwarded_to_executors(environ, expected):
    assert executor_environment(environ) == expected
