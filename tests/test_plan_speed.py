"""`plan --requests` prices each step from calls built once per layer kind (profile.forward's
`untagged`) and sums shared between steps and layouts (analysis/workload_plan.py): the
figures must equal those of the calls every layer issues, summed one by one."""

from pathlib import Path

import pytest

from microbench.analysis.fits import topology_from
from microbench.analysis.layouts import Budget, plan
from microbench.analysis.workload_plan import _op_key, lanes_of
from microbench.results.runs import load_sweep, sweep_table
from patterns import Layout, resolve_model
from patterns.engines.workloads import workload_pattern
from patterns.pattern import EngineOptions
from patterns.workload.requests import read_requests

SWEEPS = Path(__file__).resolve().parent.parent / "results" / "examples" / "plan-sweeps"
REQUESTS = "poisson:rate=50,count=24,prompt=100..2000,output=4..40,seed=3"


def _plan(model_name: str, gpus: int, untagged: bool) -> list:
    model = resolve_model(model_name)
    intra = sweep_table(load_sweep("--sweep", str(next(SWEEPS.glob("*-intra-shm")))))
    inter = sweep_table(load_sweep("--sweep-inter",
                                   str(next(SWEEPS.glob("*-inter-veth-1gbit")))))
    topology = topology_from(intra, inter, 4)
    requests = list(read_requests(REQUESTS))
    shared: dict = {}

    def make(layout: Layout):
        def lane(indices: list[int]):
            return workload_pattern("vllm", model, Layout(tp=layout.tp),
                                    [requests[i] for i in indices], None, EngineOptions(),
                                    0.03, untagged=untagged)
        return lanes_of(lane, model, layout, requests, "round-robin", 0.03,
                        shared if untagged else None)
    priced, refused = plan(model, gpus, make, topology, Budget())
    return priced, refused


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "deepseek-v3"])
def test_untagged_plan_equals_every_layer_priced(model_name):
    # llama: every layer alike; deepseek-v3: 3 dense layers, then MoE ones (layer kinds).
    # Untagged and shared (what plan runs) against tagged with nothing shared between
    # layouts (each layout's steps summed call by call): every field equal, notes included.
    fast, fast_refused = _plan(model_name, 8, True)
    slow, slow_refused = _plan(model_name, 8, False)
    assert fast and fast == slow and fast_refused == slow_refused


def test_untagged_steps_are_the_layers_calls_but_for_tags():
    model = resolve_model("deepseek-v3")
    requests = list(read_requests(REQUESTS))
    tagged = workload_pattern("vllm", model, Layout(tp=4), requests, None, EngineOptions(),
                              0.03)
    untagged = workload_pattern("vllm", model, Layout(tp=4), requests, None,
                                EngineOptions(), 0.03, untagged=True)
    for a, b in zip(tagged.segment_steps, untagged.segment_steps, strict=True):
        assert [_op_key(op) for op in a.ops] == [_op_key(op) for op in b.ops]
        assert (a.tokens, a.rows) == (b.tokens, b.rows)
    # 61 layers at tp 4: an o_proj all-reduce each, then the 3 dense layers' MLP all-reduce
    # and the 58 MoE layers' experts' all-reduce, with the embedding's and the logits': so
    # the first step has 1 + 2 x 61 + 1 = 124 calls. Untagged, 5 layer kinds (layer 0;
    # dense 1-2; 3, MoE after a dense one; MoE 4-59; 60, the last) of 2 calls each, with the
    # embedding's and the logits': 1 + 2 x 5 + 1 = 12 objects.
    first = untagged.segment_steps[0].ops
    assert len(first) == 124
    assert len({id(op) for op in first}) == 12
