"""`plan`'s memory check, stand-ins for ops a sweep lacks and compute floors, by hand on the
tiny model (tests/replay_helpers.py: hidden 64, 4 layers, vocabulary 1000 padded to 1024, 4
heads and 4 KV heads of 16, intermediate 256, bf16, LM head untied)."""

import json

import pytest

from microbench.analysis.compute import compute_floor, prefill_chunk_work
from patterns import Layout, resolve_model
from tests.replay_helpers import tiny_model
from tests.test_plan import FLAT, PLAN
from tests.test_predict import fake_sweep

# One layer on a rank of TP t: attention 2 x 64 x 4 x 16 / t (q, o) + 2 x 64 x (4 / t) x 16
# (k, v) = 16384 / t, MLP 3 x 64 x 256 / t = 49152 / t, two norms 128: 65536 / t + 128.


def _plan(cli, tmp_path, *extra: str, lines=FLAT):
    tmp_path.mkdir(exist_ok=True)
    sweep = fake_sweep(tmp_path / "sweep", lines)
    return cli("plan", "--model", tiny_model(tmp_path), "--sweep", str(sweep), *PLAN, *extra)


def test_a_layout_that_does_not_fit_is_listed_apart_and_never_best(cli, tmp_path):
    # 600,000 B a GPU: 9375 / 2^24 GiB (exact in binary), all of it usable; max_model_len
    # 12 (the request's 8 + 4), whose one request's KV cache is counted beside the batch's.
    status, out, err = _plan(cli, tmp_path, "--gpu-memory", str(9375 / 2 ** 24),
                             "--gpu-memory-utilization", "1", "--max-batched-tokens", "16",
                             "--max-model-len", "12", "--format", "json")
    assert status == 0, err
    doc = json.loads(out)
    assert doc["memory_limit_bytes"] == 600_000
    rows = {(r["tp"], r["pp"], r["dp"]): r for r in doc["layouts"]}
    dp4 = rows[(1, 1, 4)]
    # TP1: 4 x 65664 = 262656 + embedding and LM head 2 x 1024 x 64 + final norm 64 = 393792
    # parameters x 2 B = 787584 B. KV cache: 2 x 4 heads x 16 x 2 B = 256 B a token and
    # layer, 1 x (8 + 4) tokens x 4 layers: 12288 B, and as much for one request of
    # max_model_len 12. Activations (vllm-v0: the reserve, not vLLM V1's profile): 16
    # tokens (the step's budget) x (2 x 64 + 3 x 256) x 2 B = 28672 B. 840832 B > 600000:
    # does not fit.
    assert (dp4["weight_bytes_per_gpu"], dp4["kv_cache_bytes_per_gpu"],
            dp4["activation_bytes_per_gpu"]) == (787584, 12288, 28672)
    assert dp4["fits_memory"] is False and dp4["best"] is False
    # TP2 x DP2: 4 x (32768 + 128) + 2 x 1024 x 64 / 2 + 64 = 197184 x 2 B = 394368 B,
    # KV 128 B a token and layer x 48 = 6144 (and 6144 for one max_model_len request),
    # activations 16 x (128 + 3 x 128) x 2 = 16384: 423040 B, fits.
    tp2 = rows[(2, 1, 2)]
    assert (tp2["weight_bytes_per_gpu"], tp2["kv_cache_bytes_per_gpu"],
            tp2["activation_bytes_per_gpu"], tp2["fits_memory"]) == (394368, 6144, 16384, True)
    assert tp2["max_model_len_kv_bytes_per_gpu"] == 6144
    # What the KV cache gets: 600000 - 394368 - 16384 = 189248 B, / (12 x 512 B) = 30.8
    # requests of 12 tokens: 369.6, so 369 tokens.
    assert (tp2["kv_capacity_tokens"], tp2["max_concurrency"]) == (369, 30.8)
    # Every other layout fits; the one that does not is last, and the first is best.
    assert [r["fits_memory"] for r in doc["layouts"]] == [True] * 5 + [False]
    assert doc["layouts"][0]["best"]
    status, out, err = _plan(cli, tmp_path / "t", "--gpu-memory", str(9375 / 2 ** 24),
                             "--gpu-memory-utilization", "1", "--max-batched-tokens", "16",
                             "--max-model-len", "12")
    assert status == 0, err
    apart = out.split("do not fit in 585.94 KiB a GPU")[1]
    assert apart.splitlines()[3].split()[:3] == ["1", "1", "4"]


def test_memory_is_checked_by_default_from_the_gpu(cli, tmp_path):
    # No --gpu-memory: the memory --gpu's driver reports (analysis/hardware.py, each quoted
    # from an nvidia-smi table: H100 81,559 MiB, H200 143,771, B200 183,359, A100 81,920),
    # 0.9 of it usable.
    for gpu, mib in (("h100", 81559), ("h200", 143771), ("b200", 183359), ("a100", 81920)):
        status, out, err = _plan(cli, tmp_path / gpu, "--gpu", gpu, "--format", "json",
                                 "--max-model-len", "12")
        assert status == 0, err
        doc = json.loads(out)
        assert doc["memory_limit_bytes"] == int(mib / 1024 * 0.9 * 2 ** 30), gpu


def test_an_op_the_sweep_lacks_is_priced_by_its_stand_in(cli, tmp_path):
    # vLLM V1's PP2 stages each broadcast the sampled tokens (an int64 [1, 1] and an int32
    # [2, 1]: 8 B each) after the four sends of a step (the PP metadata's size and pickled
    # bytes, then the two tensors). FLAT has no broadcast: each is priced as the all-reduce
    # of 8 B over 2 ranks, 10 us. Stage 0: sends at 0, 1, 2, 3 (gap 1, latency 4 / 2 = 2:
    # arrive 2, 3, 4, 5), clock 4, broadcasts 14, 24. Stage 1: recvs at max(1, 2) = 2,
    # max(3, 3) = 3, 4, 5, broadcasts 15, 25: prefill 25. Each of the 3 decode steps starts
    # on stage 0 at the end of the last (the engine's order) and repeats the chain (under
    # async scheduling, vLLM's default, the last step broadcasts too): 25 a step, 25 + 3 x
    # 25 = 100.
    argv = ["--engine", "vllm", "--gpus", "2", "--gpus-per-node", "2", "--format", "json"]
    status, out, err = _plan(cli, tmp_path, *argv)
    assert status == 0, err
    doc = json.loads(out)
    pp2 = next(r for r in doc["layouts"] if (r["tp"], r["pp"]) == (1, 2))
    assert (pp2["prefill_us"], pp2["decode_step_us"], pp2["e2e_us"]) == (25, 25, 100)
    said = [n for n in doc["notes"] if "no broadcast" in n]
    assert said == ["the sweep has no broadcast: each is priced as the sweep's allreduce at "
                    "the same size and group (approximate; analysis/fits.py SUBSTITUTES); "
                    "sweep --op broadcast to measure it"]
    assert not doc["refused"]
    # With a broadcast of 5 us in the sweep, the sweep's own: stage 0 4 + 10 = 14, stage 1
    # 5 + 10 = 15; a step from 15: arrivals 17, 18, 19, 20, stage 1 ends 20 + 10 = 30: 15 a
    # step.
    status, out, err = _plan(cli, tmp_path / "b", *argv,
                             lines={**FLAT, "broadcast": (5.0, 0.0)})
    assert status == 0, err
    doc = json.loads(out)
    pp2 = next(r for r in doc["layouts"] if (r["tp"], r["pp"]) == (1, 2))
    assert (pp2["prefill_us"], pp2["decode_step_us"]) == (15, 15)
    assert not [n for n in doc["notes"] if "no broadcast" in n]


def test_compute_floor_of_one_layout(tmp_path):
    model = resolve_model(tiny_model(tmp_path))
    h100 = (989e12, 3.35e12)  # bf16 dense FLOP/s, HBM B/s
    # TP1: dense parameters used per token: 4 layers x (65536 + 128) + LM head 65536 =
    # 328192 (the embedding is a lookup); 656384 B of weights.
    # Prefill of 1 x 4096 tokens: 2 x 328192 x 4096 = 2,688,548,864 FLOPs, and attention
    # 4 x (4096^2 / 2 pairs) x 4 heads x 16 x 4 layers = 8,589,934,592: 11,278,483,456 /
    # 989e12 = 11.404 us against 656384 / 3.35e12 = 0.196 us of reading: compute-bound.
    floor = compute_floor(model, Layout(), "bf16", "h100", 1, 4096, 4)
    assert floor.prefill_us == pytest.approx(11_278_483_456 / h100[0] * 1e6)
    # A decode step at the mean context 4096 + 4 / 2 = 4098: 2 x 328192 + 4 x 4098 x 4 x
    # 16 x 4 = 4,852,736 FLOPs (4.9 ns); it reads the weights and 4098 x 256 B x 4 layers of
    # KV cache: 656384 + 4,196,352 = 4,852,736 B / 3.35e12 = 1.449 us: memory-bound.
    assert floor.decode_step_us == pytest.approx(4_852_736 / h100[1] * 1e6)
    # PP2 walks both stages one after the other: stage 0 2 x 65664 = 131328 parameters,
    # stage 1 131328 + 65536; the same bytes in all, so the same step (PP does not cut the
    # per-token floor); TP2 halves each rank's share: 4 x (32768 + 128) + 32768 = 164352
    # parameters, 328704 B, KV 128 B a token and layer: 328704 + 4098 x 128 x 4 = 2,426,880.
    pp2 = compute_floor(model, Layout(pp=2), "bf16", "h100", 1, 4096, 4)
    assert pp2.decode_step_us == pytest.approx(floor.decode_step_us)
    tp2 = compute_floor(model, Layout(tp=2), "bf16", "h100", 1, 4096, 4)
    assert tp2.decode_step_us == pytest.approx(2_426_880 / h100[1] * 1e6)


def test_chunked_prefill_floor_sums_its_chunks(cli, tmp_path):
    model = resolve_model(tiny_model(tmp_path))
    h100 = (989e12, 3.35e12)
    # Prompt 128 in one pass: 2 x 328192 x 128 = 84,017,152 FLOPs + attention 128^2 / 2 =
    # 8192 pairs x 4 x 4 heads x 16 x 4 layers (1024 a pair) = 8,388,608: 92,405,760 /
    # 989e12 = 0.093 us, under the 656384 B / 3.35e12 = 0.196 us weight read.
    one = compute_floor(model, Layout(), "bf16", "h100", 1, 128, 4)
    assert one.prefill_us == pytest.approx(656_384 / h100[1] * 1e6)
    # 16 tokens a step: 8 chunks, each reading every weight again; the largest chunk's
    # FLOPs, the last (queries 112..127: (128^2 - 112^2) / 2 = 1920 pairs), are 2 x 328192
    # x 16 + 1920 x 1024 = 12,468,224 (0.013 us): each chunk memory-bound, 8 x 0.196 us.
    chunked = compute_floor(model, Layout(), "bf16", "h100", 1, 128, 4, budget=16)
    assert chunked.prefill_us == pytest.approx(8 * 656_384 / h100[1] * 1e6)
    assert chunked.decode_step_us == one.decode_step_us
    # The chunks' pairs add up to one pass's: (b^2 - a^2) / 2 telescopes to 128^2 / 2 =
    # 8192. Two prompts of 12 in steps of 16: tokens 0-15 hold prompt 0 (12^2 / 2 = 72
    # pairs) and 4 of prompt 1 (4^2 / 2 = 8), then its other 8 ((12^2 - 4^2) / 2 = 64).
    assert [w for w, _ in prefill_chunk_work(1, 128, 16)] == [16] * 8
    assert sum(p for _, p in prefill_chunk_work(1, 128, 16)) == 8192
    assert prefill_chunk_work(2, 12, 16) == [(16, 80.0), (8, 64.0)]
    # Compute-bound chunks keep one pass's floor: 4096 in steps of 2048, pairs 2048^2 / 2 =
    # 2,097,152 and (4096^2 - 2048^2) / 2 = 6,291,456: 2 x 1,344,274,432 + 8,388,608 x 1024
    # = 11,278,483,456 FLOPs, as in test_compute_floor_of_one_layout.
    two = compute_floor(model, Layout(), "bf16", "h100", 1, 4096, 4, budget=2048)
    assert two.prefill_us == pytest.approx(11_278_483_456 / h100[0] * 1e6)
    # plan takes the budget from the engine's steps (--max-batched-tokens 16: 8 prefill
    # steps of 16 tokens): 8 x 0.196 = 1.567 us, one pass's 0.196 without it.
    argv = ["--engine", "vllm", "--gpus", "1", "--gpus-per-node", "1", "--prompt", "128",
            "--format", "json"]
    for extra, prefill in (([], 0.196), (["--max-batched-tokens", "16"], 1.567)):
        status, out, err = _plan(cli, tmp_path / str(prefill), *argv, *extra)
        assert status == 0, err
        assert json.loads(out)["layouts"][0]["compute_prefill_us"] == prefill


def test_gpus_not_whole_nodes_are_refused(cli, tmp_path):
    status, out, err = _plan(cli, tmp_path, "--gpus", "12", "--gpus-per-node", "8")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert ("--gpus 12 is not a whole number of nodes of --gpus-per-node 8 (its last node "
            "would hold 4); give a multiple of 8, e.g. --gpus 8") in err
