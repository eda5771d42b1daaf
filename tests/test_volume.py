"""Volume of one inference against the closed forms of DESIGN.md ("Volume")."""

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from patterns import EngineOptions, Layout, ModelConfig, Workload, generate, resolve_model
from patterns import volume_bytes as volume
from patterns.shapes import graph_batch_size, padded_vocab


def test_tp2_llama_8b_by_hand():
    # Allreduce: (2L+1)(Sp+Sd-1) h b 2(t-1)/t = 65 * 255 * 4096 * 2 * 1 = 135,782,400.
    # Gather:    Sd * (V/t) * b = 128 * 64128 * 2 = 16,416,768.
    v = volume(generate("vllm-v0", resolve_model("llama-3.1-8b"), Layout(tp=2),
                        Workload(128, 128)))
    assert v["allreduce"] == 135_782_400 and v["gather"] == 16_416_768
    assert v["total"] == 152_199_168 and v["p2p"] == 0


def test_tp2_pp2_llama_8b_by_hand():
    # Allreduces: 33 + 32 = 65 per step over 255 tokens, as for TP2: 135,782,400.
    # Sends: 2 tensors per step, each T*4096*2 bytes split over 2 ranks: 2*255*8192 = 4,177,920.
    # Allgathers: out bytes T*4096*2 times 1/2, two keys: 255 * 8192 = 2,088,960.
    # Gather as TP2: 16,416,768. Total 158,466,048.
    v = volume(generate("vllm-v0", resolve_model("llama-3.1-8b"), Layout(tp=2, pp=2),
                        Workload(128, 128)))
    assert (v["allreduce"], v["send"], v["recv"], v["allgather"], v["gather"]) == (
        135_782_400, 4_177_920, 0, 2_088_960, 16_416_768)
    assert v["p2p"] == 4_177_920 and v["total"] == 158_466_048


def test_tp3_fraction_is_exact():
    # 2(t-1)/t = 4/3 at t = 3: one layer, h = 3, prompt 1, decode 1 -> 3 allreduces of
    # [1,3] bf16 = 6 bytes, 8 bytes each by the convention: 24. Gather: 64/3 of 64 padded
    # columns is not whole, so vocab 192 -> 64 per rank -> 128 bytes.
    model = ModelConfig("tiny", 3, 1, 192, 3, 3, 8, "bf16")
    v = volume(generate("vllm-v0", model, Layout(tp=3), Workload(1, 1)))
    assert v["allreduce"] == 24 and v["gather"] == 128


_POW2 = st.sampled_from([1, 2, 4, 8])


@st.composite
def dense_models(draw) -> ModelConfig:
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    head_dim = draw(st.sampled_from([16, 64, 128]))
    return ModelConfig(name="random", hidden_size=heads * head_dim,
                       num_hidden_layers=draw(st.integers(1, 96)),
                       vocab_size=draw(st.integers(1000, 200_000)), num_attention_heads=heads,
                       num_key_value_heads=heads, intermediate_size=4 * heads * head_dim,
                       torch_dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])))


@settings(max_examples=200, deadline=None)
@given(model=dense_models(), tp=_POW2, prompt=st.integers(1, 4096), decode=st.integers(1, 4096),
       eager=st.booleans())
def test_pure_tp_volume_formula(model, tp, prompt, decode, eager):
    # (2L+1)(Sp+Sd-1) h b 2(t-1)/t + Sd (V/t) b, batch 1 (T = 1 in decode, padded or not).
    layout = Layout(tp=tp)
    v = volume(generate("vllm-v0", model, layout, Workload(prompt, decode),
                        EngineOptions(eager=eager)))
    b = 2  # bf16/fp16, and dtype=auto serves fp32 checkpoints in bf16
    L, h, t = model.num_hidden_layers, model.hidden_size, tp
    V = padded_vocab(model.vocab_size)
    expected = (2 * L + 1) * (prompt + decode - 1) * h * b * Fraction(2 * (t - 1), t)
    expected += decode * Fraction(V, t) * b if t > 1 else 0
    assert v["total"] == expected


@settings(max_examples=200, deadline=None)
@given(model=dense_models(), pp=st.integers(1, 8), prompt=st.integers(1, 4096),
       decode=st.integers(1, 4096), batch=st.integers(1, 600), eager=st.booleans())
def test_pure_pp_volume_formula(model, pp, prompt, decode, batch, eager):
    # (p-1) 2 (Sp+Sd-1) h b at batch 1; with B requests the prefill has B*Sp tokens and a
    # decode step the (maybe graph-padded) batch.
    pp = min(pp, model.num_hidden_layers)
    v = volume(generate("vllm-v0", model, Layout(pp=pp), Workload(prompt, decode, batch),
                        EngineOptions(eager=eager)))
    b = 2  # bf16/fp16, and fp32 checkpoints are served in bf16
    decode_tokens = batch if eager else graph_batch_size(batch)
    tokens = batch * prompt + (decode - 1) * decode_tokens
    assert v["total"] == v["send"] == (pp - 1) * 2 * tokens * model.hidden_size * b
    if batch == 1:
        assert v["total"] == (pp - 1) * 2 * (prompt + decode - 1) * model.hidden_size * b


@settings(max_examples=100, deadline=None)
@given(model=dense_models(), tp=_POW2, pp=st.integers(1, 6), prompt=st.integers(1, 2048),
       decode=st.integers(1, 2048))
def test_hybrid_volume_is_tp_plus_pp_plus_allgathers(model, tp, pp, prompt, decode):
    # Stages split the 2L+1 allreduces between them, so TP and PP terms add up; each
    # boundary adds 2 all-gathers of T*h*b output bytes times (t-1)/t.
    pp = min(pp, model.num_hidden_layers)
    v = volume(generate("vllm-v0", model, Layout(tp=tp, pp=pp), Workload(prompt, decode)))
    b, L, h, t = 2, model.num_hidden_layers, model.hidden_size, tp
    tokens = prompt + decode - 1
    ar = (2 * L + 1) * tokens * h * b * Fraction(2 * (t - 1), t)
    gather = decode * Fraction(padded_vocab(model.vocab_size), t) * b if t > 1 else 0
    sends = (pp - 1) * 2 * tokens * h * b
    allgathers = (pp - 1) * 2 * tokens * h * b * Fraction(t - 1, t)
    assert (v["allreduce"], v["gather"], v["send"], v["allgather"]) == (ar, gather, sends,
                                                                        allgathers)
    assert v["total"] == ar + gather + sends + allgathers
