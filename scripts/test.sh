#!/usr/bin/env bash
# Sets everything up, then runs the linters and the test suite on a real Kafka broker,
# a local Spark and a real Prometheus, and last the demo (scripts/demo_check.sh), which
# must deliver every message on time, none early and the cancelled one never, and print
# no WARNING or ERROR line. Without --all the slowest fault scenarios (marked `long`) are
# left out, which is what CI runs; --all runs every test, and the workers'
# simulations (tests/*/test_worker_simulation.py) with DELAYSERVICE_SIM_EXAMPLES
# examples per guarantee (1000 unless set) instead of CI's fixed count. Extra arguments
# go to pytest, and then the demo is left out (a selection is not the whole suite). The whole suite
# runs in DELAYSERVICE_TEST_WORKERS pytest processes (2 by default, one per core here;
# each has its own broker): most of a test is waiting on Kafka, so two halve the time.
# A selection runs in one process, where -s and pdb work.
set -euo pipefail
cd "$(dirname "$0")/.."
selection=(-m "not long")
workers=(-n "${DELAYSERVICE_TEST_WORKERS:-2}" --dist worksteal)
if [ "${1:-}" = "--all" ]; then
  selection=()
  export DELAYSERVICE_SIM_EXAMPLES="${DELAYSERVICE_SIM_EXAMPLES:-1000}"
  shift
fi
TEST_TOOLS=1 scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"  # tools installed into the venv (hadolint) are found by tests
echo "lint: ruff, ruff format, mypy --strict"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "${selection[@]}" "$@"
fi
test_log=$(mktemp)
trap 'rm -f "$test_log"' EXIT
.venv/bin/python -m pytest "${workers[@]}" "${selection[@]}" 2>&1 | tee "$test_log"
scripts/demo_check.sh
# The test run's summary line is repeated last, so it closes the output.
grep -E '^=+ .*(passed|failed).* in [0-9.]+s' "$test_log" | tail -1 || true
