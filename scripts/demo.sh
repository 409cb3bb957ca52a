#!/usr/bin/env bash
# Sets everything up, then runs the demo: a local broker, the topics, the daemon,
# and delayed messages arriving on time. Extra arguments go to scripts/demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
