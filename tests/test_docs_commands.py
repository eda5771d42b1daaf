"""Every command shown in README.md and docs/*.md is checked against the real CLI.

Each ```bash block is read line by line (backslash continuations joined). Every `infercomm ...`
command, also one after a launcher (`srun ...`, `mpiexec -n 2`, `VAR=1`), is parsed by the real
parser (microbench.cli.build_parser), so a renamed or removed flag fails here. The cheap ones
(models, engines, pattern, --help, --version, trace on files of the repo) are run in-process and
must exit 0. Relative links in the pages must name files that exist.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from microbench.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "results" / "examples" / "README.md"]
# failures.md shows bad input on purpose; tests/test_docs_failures.py runs each of its examples
CHECKED = [p for p in PAGES if p.name != "failures.md"]
FENCE = re.compile(r"^```bash\s*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CHEAP = {"models", "engines", "pattern"}


def bash_lines(text: str) -> list[str]:
    """The command lines of the ```bash blocks of `text`, continuations joined, comments dropped."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        lines += [line.strip() for line in joined.splitlines()
                  if line.strip() and not line.strip().startswith("#")]
    return lines


def infercomm_argv(line: str) -> list[str] | None:
    """The arguments after `infercomm` (or `python -m microbench`) on `line`, or None."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    for i, word in enumerate(words):
        after_option = i > 0 and words[i - 1].startswith("-")
        if "=" in word or (after_option and word != "microbench"):  # `--a env/bin/infercomm`
            continue
        module = word == "microbench" and i > 0 and words[i - 1] == "-m"
        if Path(word).name != "infercomm" and not module:
            continue
        argv = words[i + 1:]
        # a pipe or a redirection ends the command
        stop = next((j for j, w in enumerate(argv) if w in {"|", ">", "2>", "&&", ";", "||"}),
                    len(argv))
        return argv[:stop]
    return None


def commands(pages: list[Path]) -> list[tuple[str, list[str]]]:
    found = []
    for page in pages:
        for line in bash_lines(page.read_text()):
            argv = infercomm_argv(line)
            if argv is not None:
                where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
                found.append((f"{where}: {line}", argv))
    return found


def parse_error(argv: list[str]) -> str | None:
    """The parser's complaint about `argv`, or None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser(argv).parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help and --version exit 0
            return err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(exc)
    return None


ALL = commands(CHECKED)


def test_the_pages_show_commands():
    # README alone shows pattern, models, engines, replay, compare and an srun line
    assert len([c for c in ALL if c[0].startswith("README.md")]) >= 6


@pytest.mark.parametrize("where,argv", ALL, ids=[w[:80] for w, _ in ALL])
def test_every_command_parses(where: str, argv: list[str]):
    assert parse_error(argv) is None, f"{where}: {parse_error(argv)}"


def _runnable(argv: list[str]) -> bool:
    if "--help" in argv or "-h" in argv or argv == ["--version"]:
        return True
    if not argv or argv[0] not in CHEAP | {"trace"}:
        return False
    if argv[0] == "trace":  # only on files the repo holds
        files = [a for a in argv[1:] if not a.startswith("-")]
        return bool(files) and all((ROOT / f).is_file() for f in files)
    return "--out" not in argv and "-o" not in argv


RUN = [(w, a) for w, a in ALL if _runnable(a)]


@pytest.mark.parametrize("where,argv", RUN, ids=[w[:80] for w, _ in RUN])
def test_cheap_commands_run(where: str, argv: list[str], monkeypatch):
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            status = main(argv)
    except SystemExit as exc:  # --help
        status = exc.code or 0
    assert status == 0, where
    assert out.getvalue().strip(), where


def _model_named(argv: list[str]) -> str | None:
    for i, word in enumerate(argv[:-1]):
        if word == "--model":
            return argv[i + 1]
    return next((w.split("=", 1)[1] for w in argv if w.startswith("--model=")), None)


MODELS = [(w, m) for w, a in ALL if (m := _model_named(a)) is not None]


@pytest.mark.parametrize("where,model", MODELS, ids=[w[:80] for w, _ in MODELS])
def test_every_model_named_is_a_preset_or_a_path(where: str, model: str):
    # A flag that parses can still name a model that does not exist (`--model tiny` once
    # stood in the README): a preset, or something that reads as a config.json's path.
    from patterns.models import PRESETS

    looks_like_path = "/" in model or model.endswith(".json") or model.isupper()
    assert model.lower() in PRESETS or looks_like_path, f"{where}: unknown model {model!r}"


def test_the_readme_replay_runs(tmp_path: Path):
    # The README's "How long does it take here?" command, as shown, on two local ranks.
    import json
    import subprocess
    import sys

    shown = [a for w, a in ALL if w.startswith("README.md") and a[:1] == ["replay"]
             and "--device" in a and "cpu" in a]
    assert shown, "the README shows a local replay"
    proc = subprocess.run([sys.executable, "-m", "microbench", *shown[0], "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["wrong"] == 0 and last["world_size"] == 2, last


def test_the_readme_compare_says_what_the_readme_says(cli, monkeypatch):
    # "the decode step comes out `same` and prefill `inconclusive: 6 runs a side` (exit 3)":
    # the README's compare of four committed replays, as shown (the bootstrap is seeded)
    monkeypatch.chdir(ROOT)
    shown = [a for w, a in ALL if w.startswith("README.md") and a[:1] == ["compare"]]
    assert len(shown) == 1
    status, out, _ = cli(*shown[0])
    labels = {m["metric"]: m["label"] for m in json.loads(out.strip().splitlines()[-1])["metrics"]}
    assert status == 3
    assert labels["decode_step_us"] == "same"
    assert labels["prefill_us"] == "inconclusive: 6 runs a side"
    readme = (ROOT / "README.md").read_text()
    assert "`same` and prefill `inconclusive: 6 runs a side` (exit 3)" in readme


def test_a_stale_flag_fails(tmp_path: Path):
    page = tmp_path / "stale.md"
    page.write_text("Old text:\n\n```bash\ninfercomm pattern --model tiny --tp 2 \\\n"
                    "    --prompt 8 --decode 4 --pipeline 2\n"
                    "srun -N 2 infercomm replay --world 4\n```\n")
    argvs = [infercomm_argv(line) for line in bash_lines(page.read_text())]
    assert argvs == [["pattern", "--model", "tiny", "--tp", "2", "--prompt", "8",
                      "--decode", "4", "--pipeline", "2"], ["replay", "--world", "4"]]
    errors = [parse_error(a) for a in argvs if a is not None]
    assert "unrecognized arguments: --pipeline 2" in errors[0], errors
    assert "unrecognized arguments: --world 4" in errors[1], errors
    # and the same command with the real flag parses
    assert parse_error(["pattern", "--model", "tiny", "--tp", "2", "--prompt", "8",
                        "--decode", "4"]) is None


def test_the_checker_fails_a_page_with_a_flag_that_does_not_exist(tmp_path: Path):
    # The very path the real pages take (commands() then parse_error, as
    # test_every_command_parses): a fake page with one stale flag is caught, its real
    # neighbours pass.
    page = tmp_path / "fake.md"
    page.write_text("```bash\ninfercomm models\n"
                    "infercomm replay --model tiny --tp 2 --no-such-flag\n"
                    "infercomm replay --model tiny --tp 2 --prompt 8 --decode 4 --backend mpi\n"
                    "```\n")
    found = commands([page])
    assert [where for where, _ in found] == [
        "fake.md: infercomm models", "fake.md: infercomm replay --model tiny --tp 2 "
        "--no-such-flag", "fake.md: infercomm replay --model tiny --tp 2 --prompt 8 "
        "--decode 4 --backend mpi"]
    errors = [parse_error(argv) for _, argv in found]
    assert errors[0] is None and errors[2] is None
    assert errors[1] is not None and "unrecognized arguments: --no-such-flag" in errors[1]
    with pytest.raises(AssertionError, match="--no-such-flag"):
        test_every_command_parses(*found[1])
    test_every_command_parses(*found[0])


# Pages others are writing at the same time; empty this set once they have landed.
PENDING: set[str] = set()


def test_links_name_files_that_exist():
    missing = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists() and Path(target).name not in PENDING:
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing
