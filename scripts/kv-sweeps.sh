#!/usr/bin/env bash
# The two KV-transfer sweeps `infercomm plan --disagg` reads for docs/disaggregated.md: one
# within a node (2 ranks, NIXL's UCX backend on shared memory) and one across nodes (one rank
# in each of two network namespaces joined by a veth pair limited to RATE, as
# scripts/plan-sweeps.sh does; --ranks-per-node 1 marks the rows inter).
#   sudo bash scripts/kv-sweeps.sh [OUT]   (default results/examples/plan-sweeps)
# 64 descriptors a transfer, 256 B (SGLang's one-token slices) to 256 KiB; READ, as vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-1gbit}
OUT=${1:-results/examples/plan-sweeps}
TRANSPORT=${TRANSPORT:-nixl}
NS_A=infercomm-kv-a NS_B=infercomm-kv-b

cleanup() { ip netns del "$NS_A" 2>/dev/null || true; ip netns del "$NS_B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "$NS_A" && ip netns add "$NS_B"
ip link add vKA netns "$NS_A" type veth peer name vKB netns "$NS_B"
ip -n "$NS_A" addr add 10.79.0.1/24 dev vKA && ip -n "$NS_B" addr add 10.79.0.2/24 dev vKB
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set vKA up && ip -n "$NS_B" link set vKB up
ip netns exec "$NS_A" tc qdisc add dev vKA root tbf rate "$RATE" burst 256kb latency 5ms
ip netns exec "$NS_B" tc qdisc add dev vKB root tbf rate "$RATE" burst 256kb latency 5ms

mkdir -p "$OUT"
PY=$(pwd)/.venv/bin/python
MPIEXEC=$(pwd)/.venv/bin/mpiexec
export OMP_NUM_THREADS=1
"$PY" -m microbench sweep --op kvtransfer --backend mpi --kv-transport "$TRANSPORT" \
    -b 256 -e 256K -f 4 -n 20 -w 3 -c --out "$OUT" --label "kv-intra-$TRANSPORT" | tail -n 1
SWEEP=(sweep --op kvtransfer --backend mpi --kv-transport "$TRANSPORT" -b 256 -e 256K -f 4
       -n 10 -w 2 -c --ranks-per-node 1 --out "$OUT" --label "kv-inter-$TRANSPORT-veth-$RATE")
MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self "$MPIEXEC" \
    -n 1 ip netns exec "$NS_A" env UCX_NET_DEVICES=vKA "$PY" -m microbench "${SWEEP[@]}" : \
    -n 1 ip netns exec "$NS_B" env UCX_NET_DEVICES=vKB "$PY" -m microbench "${SWEEP[@]}" \
    | tail -n 1
