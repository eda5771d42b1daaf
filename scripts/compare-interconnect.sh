#!/usr/bin/env bash
# Interconnect comparison on one machine: the same pattern over MPICH with both ranks on
# shared memory, then with one rank in each of two network namespaces joined by a veth pair
# limited to RATE (tbf, both ends); then `infercomm compare` and a report.
#   sudo bash scripts/compare-interconnect.sh [OUT]   (default results/examples/shm-vs-veth-1gbit)
# Needs root (ip netns, tc). The namespaces are the project's own test hosts; traffic stays
# inside this machine. No delay is emulated: this kernel has no netem (runbook section 4).
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-1gbit}
OUT=${1:-results/examples/shm-vs-veth-${RATE}}
NS_A=infercomm-a NS_B=infercomm-b ADDR_A=10.77.0.1 ADDR_B=10.77.0.2
PATTERN=(--model llama-3.1-8b --tp 2 --prompt 128 --decode 128 --dtype fp32)
RUN=(--backend mpi --device cpu -n "${ITERS:-10}" -w 2 --check)

make --quiet setup
cleanup() { ip netns del "$NS_A" 2>/dev/null || true; ip netns del "$NS_B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "$NS_A" && ip netns add "$NS_B"
ip link add vA netns "$NS_A" type veth peer name vB netns "$NS_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev vA && ip -n "$NS_B" addr add "$ADDR_B/24" dev vB
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set vA up && ip -n "$NS_B" link set vB up
ip netns exec "$NS_A" tc qdisc add dev vA root tbf rate "$RATE" burst 256kb latency 5ms
ip netns exec "$NS_B" tc qdisc add dev vB root tbf rate "$RATE" burst 256kb latency 5ms

mkdir -p "$OUT"
last_dir() { tail -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["results_dir"])'; }
PY=$(pwd)/.venv/bin/python
MPIEXEC=$(pwd)/.venv/bin/mpiexec
export OMP_NUM_THREADS=1
A=$("$PY" -m microbench replay "${PATTERN[@]}" "${RUN[@]}" --out "$OUT" --label shm | last_dir)
# MPICH over TCP between the namespaces: NOLOCAL stops it from taking shared memory, which
# would bypass the veth; UCX is told which device and transport to use on each side.
B=$(MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self "$MPIEXEC" \
    -n 1 ip netns exec "$NS_A" env UCX_NET_DEVICES=vA "$PY" -m microbench replay \
        "${PATTERN[@]}" "${RUN[@]}" --out "$OUT" --label "veth-$RATE" : \
    -n 1 ip netns exec "$NS_B" env UCX_NET_DEVICES=vB "$PY" -m microbench replay \
        "${PATTERN[@]}" "${RUN[@]}" --out "$OUT" --label "veth-$RATE" | last_dir)
status=0
.venv/bin/infercomm compare "$A" "$B" | tee "$OUT/compare.txt" || status=$?
.venv/bin/infercomm compare "$A" "$B" --format markdown > "$OUT/compare.md" || true
.venv/bin/infercomm report "$A" "$B" -o "$OUT/report.html" | tail -n 1
exit "$status"
