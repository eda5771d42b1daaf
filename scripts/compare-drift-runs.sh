#!/usr/bin/env bash
# Six replays of one configuration, back to back, for the regression gate's own test
# (tests/test_compare_runs.py reads them): what run-to-run drift looks like on this machine.
#   bash scripts/compare-drift-runs.sh [OUT] [RUNS]   (default tests/data/compare-drift, 6)
# Then, for instance, every run against every other must not be a regression:
#   infercomm compare OUT/RUN1 OUT/RUN2
# and three against three (interleaved): infercomm compare -A OUT/R1 OUT/R3 OUT/R5 -B ...
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-tests/data/compare-drift}
RUNS=${2:-6}
for i in $(seq 1 "$RUNS"); do
    .venv/bin/infercomm replay --model llama-3.2-1b --tp 2 --prompt 32 --decode 16 -n 20 \
        --backend mpi --nproc 2 --out "$OUT" --label "drift-$i" | tail -n 1
done
