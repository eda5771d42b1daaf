"""Shared helpers: run the CLI in-process and read its last JSON line."""

import json

import pytest

from microbench.cli import main


@pytest.fixture
def cli(capsys):
    """Run `infercomm ARGS...` in-process; return (exit status, stdout, stderr)."""
    def run(*argv: str) -> tuple[int, str, str]:
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse errors exit through SystemExit
            status = exc.code
        out, err = capsys.readouterr()
        return status, out, err
    return run


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])
