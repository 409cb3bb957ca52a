#!/usr/bin/env bash
# Sets everything up, then runs the linters and the test suite on a real Kafka broker,
# a local Spark and a real Prometheus. Without --all the slowest fault scenarios (marked
# `long`) are left out, which is what CI runs; --all runs every test. Extra arguments
# go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
selection=(-m "not long")
if [ "${1:-}" = "--all" ]; then
  selection=()
  shift
fi
TEST_TOOLS=1 scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"  # tools installed into the venv (hadolint) are found by tests
echo "lint: ruff, ruff format, mypy --strict"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "${selection[@]}" "$@"
