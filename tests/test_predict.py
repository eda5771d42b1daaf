"""`infercomm predict`: alpha-beta fits recovered from synthetic sweeps (one line and a bent
one), and a pattern's predicted time checked by hand."""

import json
from pathlib import Path

import pytest

from microbench.analysis.predict import fit_points
from microbench.cli.sweep import COLUMNS, SAMPLE_COLUMNS
from microbench.results.store import csv_text
from tests.conftest import last_json
from tests.replay_helpers import tiny_model

SIZES = [8 * 4**k for k in range(11)]  # 8 B, 32 B, ... 8 MiB


def fake_sweep(folder: Path, lines: dict[str, tuple[float, float]]) -> Path:
    """A sweep run folder whose median times are exactly alpha + beta x size (2 ranks)."""
    folder.mkdir(parents=True)
    rows, samples = [], []
    for op, (alpha, beta) in lines.items():
        for size in SIZES:
            t = alpha + beta * size
            rows.append({"op": op, "size_bytes": size, "count": size // 2, "dtype": "bf16",
                         "group_size": 2, "time_us": t, "time_p5_us": t, "time_p95_us": t,
                         "algbw_gbps": 0, "busbw_gbps": 0, "wrong": ""})
            samples += [{"op": op, "size_bytes": size, "dtype": "bf16", "group_size": 2,
                         "iteration": i, "time_us": t} for i in range(3)]
    (folder / "meta.json").write_text(json.dumps({"kind": "sweep", "argv": ["sweep"],
                                                  "backend": "fake", "world_size": 2}))
    (folder / "sweep.csv").write_text(csv_text(rows, COLUMNS))
    (folder / "samples.csv").write_text(csv_text(samples, SAMPLE_COLUMNS))
    return folder


def test_one_line_is_recovered_and_not_split():
    # alpha 5 us, beta 0.001 us/B (1 GB/s): the relative least squares fit is exact.
    fit = fit_points("allreduce", 2, SIZES, [5 + 0.001 * s for s in SIZES])
    assert len(fit.pieces) == 1
    assert fit.pieces[0].alpha_us == pytest.approx(5.0)
    assert fit.pieces[0].beta_us_per_byte == pytest.approx(0.001)
    assert fit.rms_rel_error == pytest.approx(0.0, abs=1e-9)


def test_a_protocol_switch_is_found():
    # Eager below 128 KiB (10 us + 0.002 us/B), rendezvous from 128 KiB (100 us + 0.0005
    # us/B): 7 sizes below (8 B .. 32 KiB) and 4 from 128 KiB, each piece >= 3 points.
    times = [10 + 0.002 * s if s < 131072 else 100 + 0.0005 * s for s in SIZES]
    fit = fit_points("allreduce", 2, SIZES, times)
    assert [p.from_bytes for p in fit.pieces] == [8, 131072]
    assert fit.pieces[0].alpha_us == pytest.approx(10.0)
    assert fit.pieces[0].beta_us_per_byte == pytest.approx(0.002)
    assert fit.pieces[1].alpha_us == pytest.approx(100.0)
    assert fit.pieces[1].beta_us_per_byte == pytest.approx(0.0005)
    # 32 KiB uses the lower piece: 10 + 0.002 x 32768 = 75.536 us; 8 MiB the upper one:
    # 100 + 0.0005 x 8388608 = 4294.304 us.
    assert fit.time_us(32768) == pytest.approx(75.536)
    assert fit.time_us(8 << 20) == pytest.approx(4294.304)


def test_predicted_tp2_pattern_by_hand(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.01), "gather": (20.0, 0.001),
                                            "sendrecv": (4.0, 0.002)})
    model = tiny_model(tmp_path)
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm-v0",
                           "--model", model, "--tp", "2",
                           "--prompt", "8", "--decode", "4")
    assert status == 0, err
    p = last_json(out)["predicted"]
    # Tiny model tp2 (test_replay.py): per step 9 allreduces and 1 gather.
    # prefill: allreduce [8,64] bf16 = 1024 B: 10 + 0.01 x 1024 = 20.24 us, x 9 = 182.16;
    #   gather [1,512] into [1,1024] bf16 = 2048 B (nccl-tests size): 20 + 2.048 = 22.048.
    assert p["prefill_us"] == pytest.approx(182.16 + 22.048)  # 204.208
    # decode step: allreduce [1,64] = 128 B: 10 + 1.28 = 11.28 x 9 = 101.52; + 22.048.
    assert p["decode_step_us"] == pytest.approx(101.52 + 22.048)  # 123.568
    # end to end: prefill + 3 decode steps = 204.208 + 370.704.
    assert p["e2e_us"] == pytest.approx(574.912)
    assert p["allreduce_us"] == pytest.approx(182.16 + 3 * 101.52)  # 486.72
    assert p["gather_us"] == pytest.approx(4 * 22.048)  # 88.192


def test_predicted_pp2_pattern_by_hand(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"sendrecv": (4.0, 0.002)})
    model = tiny_model(tmp_path)
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm-v0",
                           "--model", model, "--pp", "2",
                           "--prompt", "8", "--decode", "4")
    assert status == 0, err
    p = last_json(out)["predicted"]
    # pp2: stage 0 sends 2 tensors of T x 64 bf16 per step, stage 1 receives them. A send is
    # half a sendrecv iteration: prefill 1024 B -> (4 + 2.048) / 2 = 3.024 us, x 2 = 6.048;
    # decode 128 B -> (4 + 0.256) / 2 = 2.128, x 2 = 4.256 a step.
    assert p["prefill_us"] == pytest.approx(6.048)
    assert p["decode_step_us"] == pytest.approx(4.256)
    assert p["e2e_us"] == pytest.approx(6.048 + 3 * 4.256)  # 18.816
    assert p["send_us"] == pytest.approx(18.816) and p["recv_us"] == pytest.approx(18.816)


def test_missing_collective_is_one_line(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", {"allreduce": (10.0, 0.01)})
    model = tiny_model(tmp_path)
    status, out, err = cli("predict", "--sweep", str(sweep), "--engine", "vllm-v0",
                           "--model", model, "--tp", "2",
                           "--prompt", "8", "--decode", "4")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "the sweep has no gather over 2 ranks (it has allreduce n=2)" in err
    status, _, err = cli("predict", "--sweep", str(sweep))
    assert status == 2 and "give the pattern options" in err


def test_against_a_committed_replay(cli):
    samples = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
    replay = next(samples.glob("*-replay-llama-3.2-1b-tp2-mpi"))
    sweep = next(samples.glob("*-sweep-mpi-mpi-host-w2"))
    status, out, err = cli("predict", "--sweep", str(sweep), "--against", str(replay))
    assert status == 0, err
    line = last_json(out)
    assert line["model"] == "llama-3.2-1b" and line["tp"] == 2
    assert set(line["measured"]) == set(line["predicted"])
    assert "measured/predicted" in out
