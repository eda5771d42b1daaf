"""Every example of docs/failures.md runs and ends as the page says (`# exit N` after it): one
line on stderr, no traceback, nothing on stdout."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "failures.md"


def examples() -> list[tuple[list[str], int]]:
    found = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S):
        for line in block.splitlines():
            command, _, said = line.partition("# exit ")
            if said:
                found.append((shlex.split(command), int(said.split(":")[0])))
    return found


def test_the_page_shows_examples():
    assert len(examples()) == 6


@pytest.mark.parametrize(("argv", "status"), examples(), ids=lambda v: str(v)[:40])
def test_each_example_ends_as_the_page_says(argv, status, tmp_path):
    assert argv[0] == "infercomm"
    proc = subprocess.run([sys.executable, "-m", "microbench", *argv[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
