#!/usr/bin/env bash
# Runs the README's first command (the demo) and fails if it exits non-zero (a message
# missing or early, the cancelled one delivered) or prints a WARNING, ERROR or traceback.
set -euo pipefail
cd "$(dirname "$0")/.."
demo_log=$(mktemp)
trap 'rm -f "$demo_log"' EXIT
echo "demo check: ./scripts/demo.sh (the README's first command)"
started=$SECONDS
if ! ./scripts/demo.sh 2>&1 | tee "$demo_log"; then
  echo "demo check: the demo failed (exit code non-zero)" >&2
  exit 1
fi
if grep -nE '^(WARNING|ERROR|CRITICAL) |Traceback' "$demo_log" >&2; then
  echo "demo check: the demo printed the WARNING/ERROR lines above" >&2
  exit 1
fi
echo "demo check: the demo passed in $((SECONDS - started)) s"
