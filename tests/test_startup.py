"""Starting a command imports only what that command needs (issue 9, item 12).

`infercomm sweep --help` once imported every command's modules and numpy to build the parser.
"""

import subprocess
import sys

import pytest

from microbench.cli import COMMANDS, build_parser

HEAVY = ("numpy", "torch", "mpi4py", "pandas", "matplotlib", "cupy")

PROBE = """
import sys
from microbench.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY_NAMES))
print('heavy=' + ','.join(heavy))
""".replace("HEAVY_NAMES", repr(HEAVY))


@pytest.mark.parametrize("argv", [["--help"], ["sweep", "--help"], ["replay", "--help"],
                                  ["pattern", "--help"], ["models", "--help"]])
def test_help_imports_no_heavy_library(argv):
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                          text=True, timeout=60, check=True)
    assert "usage:" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "heavy="  # none was imported


def test_parser_lists_every_command_and_builds_the_chosen_one_fully():
    parser = build_parser(["sweep"])
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)
    # the chosen command has its own options; the others are a name and a help line
    assert "--sizes" in sub.choices["sweep"].format_help()
    assert "--backend" not in sub.choices["replay"].format_help()
