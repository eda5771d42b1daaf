"""`plan --requests` prices each step from calls built once per layer kind (profile.forward's
`untagged`) and sums shared between steps and layouts (analysis/workload_plan.py): the
figures must equal those of the calls every layer issues, summed one by one."""

from pathlib import Path

import numpy as np
import pytest

from microbench.analysis.fits import topology_from
from microbench.analysis.lane_arrays import op_key
from microbench.analysis.layouts import Budget, plan
from microbench.analysis.workload_plan import lanes_of
from microbench.results.runs import load_sweep, sweep_table
from patterns import Layout, resolve_model
from patterns.engines.workloads import workload_pattern
from patterns.pattern import EngineOptions
from patterns.workload.requests import read_requests

SWEEPS = Path(__file__).resolve().parent.parent / "results" / "examples" / "plan-sweeps"
REQUESTS = "poisson:rate=50,count=24,prompt=100..2000,output=4..40,seed=3"


def _plan(model_name: str, gpus: int, untagged: bool, engine: str = "vllm") -> list:
    model = resolve_model(model_name)
    intra = sweep_table(load_sweep("--sweep", str(next(SWEEPS.glob("*-intra-shm")))))
    inter = sweep_table(load_sweep("--sweep-inter",
                                   str(next(SWEEPS.glob("*-inter-veth-1gbit")))))
    topology = topology_from(intra, inter, 4)
    requests = list(read_requests(REQUESTS))
    shared: dict = {}

    def make(layout: Layout):
        def lane(indices: list[int]):
            return workload_pattern(engine, model, Layout(tp=layout.tp),
                                    [requests[i] for i in indices], None, EngineOptions(),
                                    0.03, untagged=untagged)
        return lanes_of(lane, model, layout, requests, "round-robin", 0.03,
                        shared if untagged else None)
    priced, refused = plan(model, gpus, make, topology, Budget())
    return priced, refused


@pytest.mark.parametrize("model_name,engine", [("llama-3.1-8b", "vllm"),
                                               ("deepseek-v3", "vllm"),
                                               ("llama-3.1-8b", "sglang")])
def test_untagged_plan_equals_every_layer_priced(model_name, engine):
    # llama: every layer alike; deepseek-v3: 3 dense layers, then MoE ones (layer kinds).
    # Untagged and shared (what plan runs) against tagged with nothing shared between
    # layouts (each layout's steps summed call by call): every field equal, notes included.
    # SGLang's untagged keeps the tags and shares each step's calls between lanes.
    fast, fast_refused = _plan(model_name, 8, True, engine)
    slow, slow_refused = _plan(model_name, 8, False, engine)
    assert fast and fast == slow and fast_refused == slow_refused


def test_untagged_steps_are_the_layers_calls_but_for_tags():
    model = resolve_model("deepseek-v3")
    requests = list(read_requests(REQUESTS))
    tagged = workload_pattern("vllm", model, Layout(tp=4), requests, None, EngineOptions(),
                              0.03)
    untagged = workload_pattern("vllm", model, Layout(tp=4), requests, None,
                                EngineOptions(), 0.03, untagged=True)
    for a, b in zip(tagged.segment_steps, untagged.segment_steps, strict=True):
        assert [op_key(op) for op in a.ops] == [op_key(op) for op in b.ops]
        assert (a.tokens, a.rows) == (b.tokens, b.rows)
    # 61 layers at tp 4: an o_proj all-reduce each, then the 3 dense layers' MLP all-reduce
    # and the 58 MoE layers' experts' all-reduce, with the embedding's and the logits': so
    # the first step has 1 + 2 x 61 + 1 = 124 calls. Untagged, 5 layer kinds (layer 0;
    # dense 1-2; 3, MoE after a dense one; MoE 4-59; 60, the last) of 2 calls each, with the
    # embedding's and the logits': 1 + 2 x 5 + 1 = 12 objects.
    first = untagged.segment_steps[0].ops
    assert len(first) == 124
    assert len({id(op) for op in first}) == 12


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_block_sums_are_span_index_sums(engine):
    # lane_arrays.Block sums every lane of a layout at once (numpy); SpanIndex.sums is the
    # per-lane reference (patterns/workload/metrics.py). SGLang's default schedule keeps
    # decodes out of prefill steps (TPOT over decode steps alone), vLLM's does not: both
    # range kinds. Every figure must be the same float, not merely close.
    from microbench.analysis.lane_arrays import Block, lane_arrays, p90
    from patterns.workload.metrics import SpanIndex, percentile
    model = resolve_model("llama-3.1-8b")
    requests = list(read_requests(REQUESTS))
    lanes = [workload_pattern(engine, model, Layout(tp=2), requests[k::3], None,
                              EngineOptions(), 0.03) for k in range(3)]
    assert lanes[0].schedule.decode_in_mixed == (engine == "vllm")
    arrays, per_lane = [], []
    for n, lane in enumerate(lanes):
        count = len(lane.schedule.segments)
        values = [1.0 / (3 + i + 7 * n) + 0.1 * (i % 5) for i in range(count)]  # uneven
        per_lane.append(values)
        arrays.append(lane_arrays(lane, [(v, 0.0) for v in values], 0))
    ttfts, tpots, ends = [], [], [0.0]
    for lane, values in zip(lanes, per_lane, strict=True):
        ttft, tpot = SpanIndex(lane.schedule).sums(values)
        ttfts += ttft
        tpots += [t for t in tpot if t is not None]
        end = 0.0
        for value, seg in zip(values, lane.schedule.segments, strict=True):
            end += value * seg.repeat
        ends.append(end)
    padded = max(len(v) for v in per_lane)
    table = np.array([v + [0.0] * (padded - len(v)) for v in per_lane])
    ttft, tpot, end = Block(arrays).sums(table)
    assert ttft.tolist() == ttfts and tpot.tolist() == tpots and end == max(ends)
    assert len(tpots) > 0 and min(ttfts) >= 0 and max(tpots) > 0
    assert p90(ttft) == percentile(ttfts, 90) and p90(tpot) == percentile(tpots, 90)


@pytest.mark.parametrize("model_name,layout", [
    ("llama-3.1-405b", Layout(tp=8, pp=3)),  # 126 layers: 42 a stage, the LM head on the last
    ("deepseek-v3", Layout(tp=4, pp=2, dp=2, ep=True)),  # dense, then MoE layers; EP spread
])
def test_step_floors_are_step_floor(model_name, layout):
    # compute.step_floors prices many steps at once (numpy) for plan --requests; each must be
    # the float step_floor gives one step at a time.
    from microbench.analysis.compute import step_floor, step_floors
    model = resolve_model(model_name)
    floor = step_floor(model, layout, "bf16", "h100")
    steps = [(t, t * (t / s) / 2 if s else 0.0, d, c) for t, s in ((0, 0), (7, 1), (2048, 3))
             for d in (0, 1, 37) for c in (0.0, 333.5, 1900.25)]
    many = step_floors(model, layout, "bf16", "h100",
                       *(np.array([s[i] for s in steps]) for i in range(4)))
    assert many.tolist() == [floor(*s) for s in steps]
    assert len(set(many.tolist())) > 10  # the steps differ (a bandwidth-bound few alike)


def test_fit_times_are_its_time_at_each_size():
    from microbench.analysis.fits import Fit, Piece
    fit = Fit("sendrecv", 2, (Piece(0, 3.0, 0.01), Piece(4096, 20.5, 0.0025),
                              Piece(1 << 20, 700.0, 0.0011)), 0.0, 10, 8, 1 << 24)
    sizes = np.array([0, 8, 4095, 4096, 100_000, 1 << 20, 3 << 22])
    assert fit.times_us(sizes).tolist() == [fit.time_us(int(s)) for s in sizes]
    # 4096 B is the second piece's: 20.5 + 0.0025 x 4096 = 30.74 us
    assert fit.times_us(sizes)[3] == pytest.approx(30.74)


def test_lanes_volume_is_the_step_by_step_sum():
    # lanes_volume sums whole bytes as integers, each lane's totals once; the float sum over
    # every step (as before, and still its way above 2**53) must give the same number.
    from dataclasses import replace

    from microbench.analysis.layouts import layout_of, valid_layouts
    from microbench.analysis.workload_plan import lanes_volume, price_lanes
    from patterns.volume import op_volume
    model = resolve_model("llama-3.1-8b")
    requests = list(read_requests(REQUESTS))
    intra = sweep_table(load_sweep("--sweep", str(next(SWEEPS.glob("*-intra-shm")))))
    inter = sweep_table(load_sweep("--sweep-inter",
                                   str(next(SWEEPS.glob("*-inter-veth-1gbit")))))
    topology = topology_from(intra, inter, 4)
    layout = layout_of(next(s for s in valid_layouts(model, 8)[0] if s.pp == 2 and s.dp == 2))

    def lane(indices):
        return workload_pattern("vllm", model, Layout(tp=layout.tp),
                                [requests[i] for i in indices], None, EngineOptions(), 0.03,
                                untagged=True)
    lanes = lanes_of(lane, model, layout, requests, "round-robin", 0.03)
    price_lanes(lanes, topology, "h100")  # lanes_volume reads the arrays it makes
    # per step: its calls' bytes, then 2 tensors of [T, 4096] bf16 per hop (1 hop at pp 2)
    # from each of tp ranks, and vLLM's sampled tokens (int64 [S, 1] + int32 [S + 1, 1])
    hop = 2 * 4096 * 2 * layout.tp * 1
    expected = 0.0
    for pattern in lanes.lanes:
        for step, seg in zip(pattern.segment_steps, pattern.schedule.segments, strict=True):
            calls = 0.0
            for op in step.ops:
                calls += op_volume(op)
            samples = seg.shape.samples
            sampled = 8 * samples + 4 * (samples + 1) if samples else 0
            expected += (calls + hop * step.tokens + sampled) * seg.repeat
    assert lanes_volume(lanes) == expected > 0
    for pattern in lanes.lanes:  # forced through the float sum, as above 2**53
        key = ("lane", id(pattern))
        lanes.shared[key] = replace(lanes.shared[key], volume_sums=(2 ** 53, 0, 0))
    assert lanes_volume(lanes) == expected


def test_unique_rows_numbers_each_row_by_its_distinct_row():
    from microbench.analysis.lane_arrays import unique_rows
    table = np.array([[3, 1], [0, 7], [3, 1], [2, 2], [0, 7]])
    huge = table * (1 << 40)  # ranges too wide for one int64 key: np.unique(axis=0)
    for t in (table, huge):
        rows, number = unique_rows(t)
        assert len(rows) == 3  # (3, 1), (0, 7), (2, 2)
        assert (rows[number] == t).all()
