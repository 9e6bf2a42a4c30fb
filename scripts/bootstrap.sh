#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine: uv, then the locked virtual environment
# in .venv/. Idempotent: a second run only checks that the environment matches uv.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9

if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  echo "bootstrap: installing uv $UV_VERSION" >&2
  python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi

# The lock file pins every package; --frozen refuses to run if pyproject.toml and uv.lock disagree.
uv sync --frozen --quiet
# Prove the installed set is consistent.
uv pip check --quiet --python .venv/bin/python

# The Node.js programs, each pinned by its packaging/<name>/package-lock.json: kinesis-mock, the Kinesis
# emulator, and the StatsD daemon (npm statsd) the metrics tests send Airflow's metrics to. Optional
# dependencies (statsd's syslog and hashring backends, a native build) are left out.
if ! command -v node >/dev/null 2>&1; then
  echo "bootstrap: Node.js is required for kinesis-mock and StatsD; installing Debian's nodejs and npm" >&2
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
for program in kinesis-mock statsd; do
  lock=packaging/$program/package-lock.json
  stamp=packaging/$program/node_modules/.installed-from-lock
  if [ ! -f "$stamp" ] || ! cmp -s "$lock" "$stamp"; then
    npm ci --prefix "packaging/$program" --omit=optional --no-audit --no-fund --loglevel=error >/dev/null
    cp "$lock" "$stamp"
  fi
done

# Debian's PostgreSQL for the deployment tests (tests/deployment): Airflow's metadata database, a
# throwaway cluster per test module on 127.0.0.1 (tests/support/postgres_server.py).
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "bootstrap: installing Debian's postgresql for the deployment tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

# Debian's Chromium for the browser tests (tests/browser): Playwright drives /usr/bin/chromium and
# never downloads a browser of its own.
if [ ! -x /usr/bin/chromium ]; then
  echo "bootstrap: installing Debian's chromium and chromium-driver for the browser tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
