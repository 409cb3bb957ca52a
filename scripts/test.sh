#!/usr/bin/env bash
# Sets everything up, then runs the linters and the whole test suite on a real
# Kafka broker, a local Spark and a real Prometheus. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
TEST_TOOLS=1 scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"  # tools installed into the venv (hadolint) are found by tests
echo "lint: ruff, ruff format, mypy --strict"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
