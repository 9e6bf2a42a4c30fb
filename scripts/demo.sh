#!/usr/bin/env bash
# Run the main job on the embedded default (emulators on loopback). See README.md for what it does today.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python scripts/embedded_demo.py "$@"
