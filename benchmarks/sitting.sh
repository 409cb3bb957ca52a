#!/usr/bin/env bash
# Every row of the README's performance table in one sitting, one after another, so the
# figures come from one machine state. Each benchmark starts its own local broker
# unless BOOTSTRAP=host:port names one. The output of each row goes to
# $OUT/<row>.txt (default benchmarks/results/<date>), and the lines that carry its
# figures are printed as it ends. About an hour on a 2-vCPU machine.
#
#   benchmarks/sitting.sh                  # every row
#   benchmarks/sitting.sh forwarding burst # only the rows named
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results/$(date -u +%Y%m%dT%H%M)}
mkdir -p "$out"
py=.venv/bin/python
extra=()
if [ -n "${BOOTSTRAP:-}" ]; then
  extra=(--bootstrap "$BOOTSTRAP")
fi

declare -A rows=(
  [forwarding]="benchmarks/forwarding.py --messages 200000 --rounds 2"
  [catch_up]="benchmarks/forwarding.py --messages 1000000 --rounds 1"
  [steady_alo]="benchmarks/steady_lateness.py"
  [steady_alo_hog]="benchmarks/steady_lateness.py --hogs 1"
  [steady_eos]="benchmarks/steady_lateness.py --guarantee exactly-once"
  [steady_eos_hog]="benchmarks/steady_lateness.py --guarantee exactly-once --hogs 1"
  # The same loads with one worker per level (the seeds' layout), for comparison.
  [forwarding_per_level]="benchmarks/forwarding.py --messages 200000 --rounds 2 --level-workers per-level"
  [steady_alo_per_level]="benchmarks/steady_lateness.py --level-workers per-level"
  [steady_eos_per_level]="benchmarks/steady_lateness.py --guarantee exactly-once --level-workers per-level"
  # A backlog parked in the 2 h level beside a steady flow on the 1 s one, and the
  # same flow alone: one level's backlog must not slow another.
  [isolation_quiet]="benchmarks/steady_lateness.py --seconds 30 --rate 2000 --levels 1s,2h --park-top"
  [isolation_backlog]="benchmarks/steady_lateness.py --seconds 30 --rate 2000 --levels 1s,2h --backlog 300000"
  [idle]="benchmarks/idle_footprint.py"
  [idle_per_level]="benchmarks/idle_footprint.py --level-workers per-level"
  [burst]="benchmarks/steady_lateness.py --burst 300000 --levels 5s"
  # Cancels at scale: a share of real cancels, alone and beside a flood of markers.
  [cancels_quiet]="benchmarks/marker_flood.py --flood 0"
  [marker_flood_100k]="benchmarks/marker_flood.py --flood 100000"
  [marker_flood_1m]="benchmarks/marker_flood.py --flood 1000000"
  [memory]="benchmarks/memory_per_message.py --messages 300000"
  [precise_burst_300k]="benchmarks/precise_burst.py --messages 300000 --max-buffered-mib 256"
  [precise_burst_500k]="benchmarks/precise_burst.py --messages 500000 --max-buffered-mib 256"
  [precise_restart]="benchmarks/precise_restart.py"
  # Precise mode under each guarantee, side by side (targets read read_committed).
  [precise_burst_300k_eos]="benchmarks/precise_burst.py --messages 300000 --max-buffered-mib 256 --guarantee exactly-once"
  [precise_steady_5k_alo]="benchmarks/precise_lateness.py --parts steady --modes precise --rate 5000"
  [precise_steady_5k_eos]="benchmarks/precise_lateness.py --parts steady --modes precise --rate 5000 --guarantee exactly-once"
  [precise_restart_eos]="benchmarks/precise_restart.py --guarantee exactly-once"
  [precise_long_delay]="benchmarks/precise_long_delay.py --messages 500000"
  # The exactly-once commit point's shapes, without the daemon.
  [commit_shapes]="benchmarks/commit_shapes.py --rounds 2"
  [commit_shapes_neighbour]="benchmarks/commit_shapes.py --rounds 2 --neighbour"
)
order=(forwarding catch_up steady_alo steady_alo_hog steady_eos steady_eos_hog forwarding_per_level
  steady_alo_per_level steady_eos_per_level isolation_quiet isolation_backlog idle idle_per_level
  burst cancels_quiet marker_flood_100k marker_flood_1m memory precise_burst_300k precise_burst_300k_eos precise_burst_500k precise_restart
  precise_restart_eos precise_steady_5k_alo precise_steady_5k_eos precise_long_delay commit_shapes
  commit_shapes_neighbour)
if [ "$#" -gt 0 ]; then
  order=("$@")
fi

for row in "${order[@]}"; do
  command=${rows[$row]:-}
  if [ -z "$command" ]; then
    echo "unknown row $row; rows: ${!rows[*]}" >&2
    exit 2
  fi
  echo "== $row: python $command (started $(date -u +%H:%M:%S))"
  # shellcheck disable=SC2086  # the command is a word list on purpose
  $py $command "${extra[@]}" >"$out/$row.txt" 2>&1 || echo "   $row exited $?"
  grep -vE '^%[0-9]\|' "$out/$row.txt" | tail -n 25 | sed 's/^/   /'
done
echo "results in $out"
