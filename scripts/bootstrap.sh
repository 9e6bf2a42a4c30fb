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
# Prove the installed set is consistent (the pyspark-client trap of STACK.md included).
uv pip check --quiet --python .venv/bin/python
