"""Readers check a file's rows against its meta.json (fault battery item 8): an iterations.csv
cut mid-row or short of rows, a duplicated row, or a sweep case missing iterations is refused
in one line by every reader (compare, report, predict --against, load), exit status 2."""

import shutil
from pathlib import Path

import pytest

from microbench.argtypes import UsageError
from microbench.results import load

SAMPLES = Path(__file__).resolve().parent.parent / "results" / "examples" / "samples"
REPLAY = next(SAMPLES.glob("*-replay-llama-3.2-1b-tp2-mpi"))  # meta "iterations": 5
SWEEP = next(SAMPLES.glob("*-sweep-mpi-mpi-host-w2"))  # 10 timed calls a case


def damaged(tmp_path: Path, source: Path, filename: str, edit) -> Path:
    folder = tmp_path / source.name
    shutil.copytree(source, folder)
    path = folder / filename
    path.write_text(edit(path.read_text()))
    return folder


def cut_mid_row(text: str) -> str:
    # The header, rows 0 and 1 whole, row 2 cut after its fifth field: 2 whole rows of 5.
    lines = text.splitlines()
    return "\n".join([*lines[:3], ",".join(lines[3].split(",")[:5])]) + "\n"


def test_the_sample_reads_as_it_was_written():
    assert len(load(REPLAY).iterations) == 5 and len(load(SWEEP).samples) == 400


def test_an_iterations_file_cut_mid_row_is_refused(tmp_path):
    folder = damaged(tmp_path, REPLAY, "iterations.csv", cut_mid_row)
    with pytest.raises(UsageError, match=r"3 rows, but meta.json says 5 timed iterations"):
        _ = load(folder).iterations


def test_a_duplicated_row_is_refused(tmp_path):
    def duplicate(text: str) -> str:  # row 1 written twice in place of row 4
        lines = text.splitlines()
        return "\n".join([*lines[:5], lines[2]]) + "\n"
    folder = damaged(tmp_path, REPLAY, "iterations.csv", duplicate)
    with pytest.raises(UsageError, match=r"line 6 repeats an earlier row's iteration"):
        _ = load(folder).iterations


def test_a_sweep_case_short_of_iterations_is_refused(tmp_path):
    folder = damaged(tmp_path, SWEEP, "samples.csv",
                     lambda t: "\n".join(t.splitlines()[:-1]) + "\n")  # its last row gone
    with pytest.raises(UsageError, match=r"9 rows for .*meta.json says 10 timed iterations"):
        _ = load(folder).samples


@pytest.mark.parametrize("command", [["compare", "{good}", "{bad}"], ["report", "{bad}"],
                                     ["predict", "--sweep", str(SWEEP), "--against", "{bad}"]])
def test_every_reader_refuses_it_in_one_line(tmp_path, cli, command):
    bad = damaged(tmp_path, REPLAY, "iterations.csv", cut_mid_row)
    argv = [a.format(good=REPLAY, bad=bad) for a in command]
    if argv[0] == "report":
        argv += ["-o", str(tmp_path / "r.html")]
    status, _, err = cli(*argv)
    assert status == 2 and "Traceback" not in err, err
    assert "5 timed iterations" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.html").exists()
