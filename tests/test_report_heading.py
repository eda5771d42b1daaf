"""A single-run report says what ran in its title and heading; text cells are left-aligned."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from microbench.analysis.heading import run_heading
from microbench.cli import main
from microbench.results.runs import load_run

RUN = (Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
       / "20261122T035610Z-replay-llama-3.2-1b-tp2-mpi")


def test_single_run_heading_states_what_ran(tmp_path: Path, capsys):
    # meta.json of that run: vllm-v0 llama-3.2-1b TP2, prompt 32 decode 16, -n 5, MPICH 5.0.2
    head = run_heading(load_run(RUN))
    assert head == ("llama-3.2-1b (vllm-v0) | TP2 PP1 | prompt 32, decode 16, batch 1, bf16 | "
                    "5 iterations | mpi on cpu, 2 ranks | MPICH 5.0.2, mpi4py 4.1.2 | hosts vm")
    out = tmp_path / "r.html"
    assert main(["report", str(RUN), "-o", str(out)]) == 0
    page = out.read_text()
    assert f"<title>{head}</title>" in page and f"<h1>{head}</h1>" in page
    assert "<td>replay</td>" in page and "<td class='n'>" in page  # text left, numbers right
    assert "td.n{text-align:right}" in page and "text-align:left}" in page


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no chromium (apt-get install chromium)")
def test_report_loads_in_headless_chromium(tmp_path: Path):
    out = tmp_path / "r.html"
    assert main(["report", str(RUN), "-o", str(out)]) == 0
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", out.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "<h1>llama-3.2-1b (vllm-v0)" in dom
    assert len(re.findall(r"<img ", dom)) >= 1  # the figures are inline PNGs
