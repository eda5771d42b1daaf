"""What the repository keeps in git: `make demo` output stays out of it (issue 9, item 13)."""

import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=False)


pytestmark = pytest.mark.skipif(_git("rev-parse", "HEAD").returncode != 0,
                                reason="not a git checkout")


def test_make_demo_writes_only_to_an_ignored_folder():
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "demo"], capture_output=True,
                         text=True, check=True).stdout
    # the demo's own commands, not setup's recipe lines (in a fresh clone `make -n` prints
    # them too, one of them an echo that mentions replay)
    replays = [shlex.split(line) for line in dry.splitlines()
               if line.split(" ")[0].endswith("/infercomm") and " replay " in line]
    assert len(replays) == 2  # gloo and MPI
    for argv in replays:
        assert "--out" in argv, argv  # without it the runs land in results/
        out = argv[argv.index("--out") + 1]
        assert Path(out).parts[0] != "results", out
        # `git check-ignore` exits 0 when the path is ignored
        assert _git("check-ignore", "-q", f"{out}/20990101T000000Z-run/meta.json").returncode == 0


def test_no_demo_run_is_tracked_under_results():
    tracked = _git("ls-files", "results").stdout.split()
    stray = [p for p in tracked
             if p != "results/README.md" and not p.startswith("results/examples/")]
    assert stray == []


def test_no_run_folder_is_tracked_outside_results():
    # A run folder (its meta.json) committed from a command run at the repository root
    # (33928ee had one); committed runs live under results/examples/ with their README.
    tracked = _git("ls-files").stdout.split()
    stray = [p for p in tracked if Path(p).name == "meta.json"
             and not p.startswith(("results/examples/", "tests/data/"))]
    assert stray == []
