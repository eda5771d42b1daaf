#!/usr/bin/env bash
# The two sweeps `infercomm plan` reads for the README's "Planning a layout": one within a
# node (2 MPICH ranks on shared memory) and one across nodes (one rank in each of two network
# namespaces joined by a veth pair limited to RATE, as scripts/compare-interconnect.sh does;
# --ranks-per-node 1 marks every row inter, since both namespaces share the hostname).
#   sudo bash scripts/plan-sweeps.sh [OUT]   (default results/examples/plan-sweeps)
# fp32: MPICH sums fp32 itself, where bf16 is infercomm's Python sum (README, "16-bit floats
# over MPI"); the fits price bytes, so a bf16 pattern's calls take the fp32 call of equal size.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-1gbit}
OUT=${1:-results/examples/plan-sweeps}
NS_A=infercomm-plan-a NS_B=infercomm-plan-b
# Every op plan and predict price: vLLM V1's pipeline stages broadcast the sampled tokens,
# MoE layers reduce-scatter (and all-to-all under --a2a alltoall).
OPS=allreduce,allgather,reducescatter,alltoall,broadcast,gather,sendrecv,stream

# PY=path/to/python uses that environment (its mpiexec beside it) instead of make setup's
if [ -z "${PY:-}" ]; then make --quiet setup; PY=$(pwd)/.venv/bin/python; fi
MPIEXEC=$(dirname "$PY")/mpiexec
cleanup() { ip netns del "$NS_A" 2>/dev/null || true; ip netns del "$NS_B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "$NS_A" && ip netns add "$NS_B"
ip link add vPA netns "$NS_A" type veth peer name vPB netns "$NS_B"
ip -n "$NS_A" addr add 10.78.0.1/24 dev vPA && ip -n "$NS_B" addr add 10.78.0.2/24 dev vPB
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set vPA up && ip -n "$NS_B" link set vPB up
ip netns exec "$NS_A" tc qdisc add dev vPA root tbf rate "$RATE" burst 256kb latency 5ms
ip netns exec "$NS_B" tc qdisc add dev vPB root tbf rate "$RATE" burst 256kb latency 5ms

mkdir -p "$OUT"
export OMP_NUM_THREADS=1
"$PY" -m microbench sweep --backend mpi --device cpu --op "$OPS" -b 8 -e 32M -f 4 \
    --dtype fp32 -n 20 -w 3 -c --out "$OUT" --label intra-shm | tail -n 1
SWEEP=(sweep --backend mpi --device cpu --op "$OPS" -b 8 -e 8M -f 4 --dtype fp32 -n 10 -w 2
       -c --ranks-per-node 1 --out "$OUT" --label "inter-veth-$RATE")
MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self "$MPIEXEC" \
    -n 1 ip netns exec "$NS_A" env UCX_NET_DEVICES=vPA "$PY" -m microbench "${SWEEP[@]}" : \
    -n 1 ip netns exec "$NS_B" env UCX_NET_DEVICES=vPB "$PY" -m microbench "${SWEEP[@]}" \
    | tail -n 1
