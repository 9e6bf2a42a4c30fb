# The project image, built from the repository root (see .dockerignore): Airflow 3.3.2 on Python
# 3.11, a Java runtime for Spark, the dependencies locked in uv.lock, and this project (lease_core,
# spark_jobs, and kinesis_lease: the operators and the monitoring UI's plugin) installed as a wheel,
# registered with Airflow by its entry points: Airflow needs only the DAG file besides (mounted by
# docker-compose.yaml). Every Airflow service, the Spark master and both Spark workers run this one
# image, so the Spark driver (inside the scheduler) and the executors run the same Python with the
# same packages, as PySpark requires.
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
# The uv that scripts/bootstrap.sh pins; only its binary is taken.
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

FROM ${AIRFLOW_IMAGE}

# Spark 4 runs on Java 17 or 21. Debian bookworm (the Airflow image's base) ships openjdk-17; on a
# base without it, build with --build-arg JAVA_PACKAGE=openjdk-21-jre-headless.
ARG JAVA_PACKAGE=openjdk-17-jre-headless
USER root
# The man1 folder is missing on slim Debian images, and the JDK's update-alternatives links into it.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends "${JAVA_PACKAGE}" \
    && apt-get autoremove -yqq --purge \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
# Mount points of named volumes (the Parquet output, the sign-in file): a new named volume takes
# the owner of the image's folder, so the airflow user (uid 50000) can write there. The source folder
# is the airflow user's too (WORKDIR would create it owned by root).
RUN install -d -o airflow -g 0 -m 0775 /opt/kinesis-lease/output /opt/airflow/auth /opt/kinesis-lease-batch
USER airflow

COPY --from=uv /uv /usr/local/bin/uv

# SPARK_HOME is the installed pyspark package (its bin/ holds spark-class and spark-submit);
# PYSPARK_PYTHON is the Airflow virtualenv's Python, the same in the driver and on the executors.
# docker/check_image.py fails the build if either stops matching the installed files.
ENV SPARK_HOME=/home/airflow/.local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/home/airflow/.local/bin/python

WORKDIR /opt/kinesis-lease-batch
# The locked dependencies first, in their own layer (rebuilt only when the lock changes).
# --no-deps installs exactly the locked set, nothing resolved anew; uv checks the exported hashes.
COPY --chown=airflow:0 pyproject.toml uv.lock ./
RUN uv export --frozen --no-dev --no-emit-project --output-file requirements.txt \
    && uv pip install --python "$(command -v python)" --no-cache --no-deps --requirements requirements.txt

# The project itself, as a wheel (not editable): lease_core, spark_jobs, kinesis_lease (from
# plugins/kinesis_lease, with the UI's static files) and the leasectl command.
COPY --chown=airflow:0 README.md ./
COPY --chown=airflow:0 lease_core lease_core
COPY --chown=airflow:0 spark_jobs spark_jobs
COPY --chown=airflow:0 plugins/kinesis_lease plugins/kinesis_lease
COPY --chown=airflow:0 docker/check_image.py docker/check_image.py
RUN uv pip install --python "$(command -v python)" --no-cache --no-deps . \
    && python docker/check_image.py requirements.txt

WORKDIR /opt/airflow
