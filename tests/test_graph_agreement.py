"""Every member of every communicator issues the same calls, captured or eager alike, the same
number of times: each rank's replay plan built and run on a recording backend
(microbench/replay/agreement.py), for a matrix of patterns. Pure Python, no communication.
"""

import dataclasses

import pytest

from microbench.replay.agreement import disagreements, modes, rank_log
from microbench.replay.plan import Plan
from patterns import ENGINES, ConfigError, EngineOptions, Layout, Workload, generate, resolve_model

DENSE, MOE = "llama-3.1-8b", "qwen3-30b-a3b"
LAYOUTS = {  # name: (model, layout, workload, options)
    "tp2": (DENSE, Layout(tp=2), Workload(prompt=64, decode=4), EngineOptions()),
    "tp2xpp2": (DENSE, Layout(tp=2, pp=2), Workload(prompt=64, decode=4), EngineOptions()),
    "dp2xep": (MOE, Layout(tp=1, dp=2, ep=True), Workload(prompt=64, decode=4),
               EngineOptions()),
    "tp2xdp2xep": (MOE, Layout(tp=2, dp=2, ep=True), Workload(prompt=64, decode=4),
                   EngineOptions()),
    # Uneven DP with chunked prefill: DP rank 1 still prefills (4 prompts of 2048 tokens,
    # 2048 tokens a step) while DP rank 0 decodes (the review's W2 demonstration); without
    # vLLM's DP wave tail, whose dummy forwards "dp2xep" keeps.
    "dp2xep-uneven": (MOE, Layout(tp=1, dp=2, ep=True),
                      Workload(prompt=2048, decode=8, dp_batches=(1, 4)),
                      EngineOptions(max_batched_tokens=2048, wave_tail=False)),
    "tp2xdp2-uneven": (DENSE, Layout(tp=2, dp=2), Workload(prompt=2048, decode=8,
                                                           dp_batches=(1, 4)),
                       EngineOptions(max_batched_tokens=2048)),
}


def _pattern(engine: str, name: str):
    model, layout, workload, options = LAYOUTS[name]
    if engine != "vllm":  # --no-wave-tail is vLLM's alone
        options = dataclasses.replace(options, wave_tail=True)
    try:
        return generate(engine, resolve_model(model), layout, workload, options)
    except ConfigError as err:  # the engine does not run this layout (e.g. megatron DP)
        pytest.skip(f"{engine} {name}: {err}")


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_members_of_every_communicator_agree(engine, name):
    pattern = _pattern(engine, name)
    assert disagreements(pattern, graphs=True) == []
    assert disagreements(pattern, graphs=False) == []


def test_the_matrix_covers_every_engine_and_uneven_dp():
    ran = set()
    for engine in ENGINES:
        for name in LAYOUTS:
            try:
                _pattern(engine, name)
            except pytest.skip.Exception:
                continue
            ran.add((engine, name))
    assert {engine for engine, _ in ran} == set(ENGINES)
    assert {e for e, n in ran if n == "dp2xep-uneven"} >= {"vllm", "sglang"}


def test_uneven_dp_ranks_capture_only_where_both_decode():
    """W2: DP rank 0 decodes from step 1 while DP rank 1 still prefills until step 4; no rank
    may capture the EP calls of steps 1-3, and both must capture the later ones."""
    pattern = _pattern("vllm", "dp2xep-uneven")
    runs = [[(r.phase.value, r.repeat) for r in pattern.runs_of_rank(k)] for k in (0, 1)]
    # The run lists that made the old per-rank cut disagree (gpu_review.md, W2):
    assert runs == [[("prefill", 1), ("decode", 3), ("decode", 4), ("decode", 3)],
                    [("prefill", 1), ("prefill", 3), ("decode", 7)]]
    logs = [rank_log(pattern, k, graphs=True) for k in (0, 1)]
    for log in logs:
        events = log.log[("dp0",)]  # tp 1: every EP call is on the DP x EP communicator
        count = {mode: sum(1 for e in events if e[0] == mode)
                 for mode in ("eager", "warm-up", "graph")}
        # 193 calls a step on both ranks, one of them vLLM's per-step DP sync (a gloo op,
        # kept eager: the engine runs it on the host, N4). Steps 0-3 eager on both:
        # 4 x 193 = 772. Steps 4-7 and 8-10 (rank 0's runs cut both ranks' timelines): two
        # graph sets, each warmed up once, 2 x 192 = 384 warm-up calls, launched 4 + 3 = 7
        # times: 7 x 192 = 1344 calls, and the 7 DP syncs eager: 772 + 7 = 779.
        assert count == {"eager": 779, "warm-up": 384, "graph": 1344}
    assert logs[0].log == logs[1].log


def _own_runs(rank: int, plan: Plan) -> None:
    """Yesterday's rule on one rank: cut graphs from its own decode runs."""
    if rank == 1:
        plan.pieces = None


def _drop_last_op(rank: int, plan: Plan) -> None:
    if rank == 1:
        run = plan.runs[-1]
        plan.runs[-1] = dataclasses.replace(run, ops=run.ops[:-1], calls=run.calls[:-1])


@pytest.mark.parametrize("alter", [_own_runs, _drop_last_op])
def test_the_check_fails_when_one_rank_differs(alter):
    pattern = _pattern("vllm", "dp2xep-uneven")
    found = disagreements(pattern, graphs=True, alter=alter)
    assert found and "ranks 0 and 1 differ" in found[0]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "vllm-v0"])
def test_pp_calls_stay_out_of_the_graphs(engine):
    """R1: as vLLM, the stages' P2P calls (and V2's sampled-token broadcasts on its
    pp_broadcast group) are eager; their TP collectives are captured."""
    pattern = _pattern(engine, "tp2xpp2")
    for rank in range(4):
        log = rank_log(pattern, rank, graphs=True)
        seen = modes(log)
        assert seen["p2p"] == {"eager"}
        assert "graph" in seen["allreduce"]
        for channel, events in log.log.items():
            if channel[0].startswith("pp"):
                assert {mode for mode, *_ in events} == {"eager"}, channel


def test_graph_pieces_of_the_uneven_dp_pattern():
    from microbench.replay.graph_spans import graph_pieces

    # Rank 0's runs end at steps 1, 4, 8, 11 and rank 1's at 1, 4, 11: pieces cut at every
    # one; steps 1-3 are decode on rank 0 only (rank 1 prefills), so eager everywhere.
    assert graph_pieces(_pattern("vllm", "dp2xep-uneven")) == (
        (0, 1, False), (1, 4, False), (4, 8, True), (8, 11, True))
