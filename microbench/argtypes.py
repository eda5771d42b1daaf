"""Argument parsing in the field's vocabulary, with one-line errors and exit status 2."""

import argparse
import re
import sys
from typing import NoReturn

from patterns.errors import shown


class UsageError(Exception):
    """Bad command-line input found after parsing; printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage and then the error; our contract is one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


MAX_DIGITS = 18  # no count, size or layout of ours has more; a message never prints more


def _integer(text: str) -> int:
    digits = text.strip().lstrip("+-")
    if digits.isdigit() and len(digits) > MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"an integer of {len(digits):,} digits is beyond any "
                                         f"count here (at most {MAX_DIGITS} digits)")
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):  # int() also reads '２' and '1_0'
        raise argparse.ArgumentTypeError(f"{shown(text, 40)!r} is not an integer")
    return int(text)


def positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be zero or more")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers: 3,5,2,8."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and len(p) <= MAX_DIGITS and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"{shown(text, 40)!r} is not a comma-separated list of positive integers, e.g. "
            "3,5,2,8")
    return tuple(int(p) for p in parts)


def rank_list(text: str) -> tuple[int, ...]:
    """A comma-separated list of ranks: 0 or 0,1,3."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and len(p) <= MAX_DIGITS for p in parts):
        raise argparse.ArgumentTypeError(
            f"{shown(text, 40)!r} is not a comma-separated list of ranks, e.g. 0 or 0,1")
    return tuple(int(p) for p in parts)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text, 40)!r} is not a number") from None
    if not value > 0 or value == float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"{shown(text, 40)} must be a positive number")
    return value


def folder_path(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path is not a folder; pass a folder such as "
                                         "results")
    return text


_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def byte_size(text: str) -> int:
    """A size as nccl-tests writes it: 8, 8K, 1M, 2G (binary multiples)."""
    raw = text.strip().upper().removesuffix("B")
    number, suffix = (raw[:-1], raw[-1]) if raw[-1:] in _SUFFIXES else (raw, "")
    try:
        value = int(number) * _SUFFIXES[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; write bytes like 8, 8K, 1M or 2G") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must not be negative")
    return value


# A run folder is `<UTC stamp>-<label>[-N]`, and a file system takes 255 bytes a name; a label
# longer than this is a mistake, found before the run rather than when its folder is named.
MAX_LABEL_CHARS = 120


def model_name(text: str) -> str:
    """--name: printed in every header and JSON line and named in the run's folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name names nothing; pass the model's name "
                                         "(e.g. my-llama-8b) or drop --name")
    if len(text) > MAX_LABEL_CHARS or not text.isprintable():
        raise argparse.ArgumentTypeError(f"'{shown(text, 40)}': a name is at most "
                                         f"{MAX_LABEL_CHARS} printable characters")
    return text


def run_label(text: str) -> str:
    """--label: it names the run's folder and is printed, so it is one printable line and
    names no other folder ('/', '..')."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty label names nothing; pass a few words such "
                                         "as nccl-2.27 or drop --label")
    if len(text) > MAX_LABEL_CHARS:
        raise argparse.ArgumentTypeError(f"a label of {len(text):,} characters; use at most "
                                         f"{MAX_LABEL_CHARS} (it names the run's folder)")
    if not text.isprintable() or "/" in text or "\\" in text or ".." in text:
        raise argparse.ArgumentTypeError(f"'{shown(text, 40)}': a label names the run's folder: "
                                         "printable characters without '/', '\\' or '..' (e.g. "
                                         "nccl-2.27)")
    return text


# Longer than any path a system takes (PATH_MAX), or a part of it than any file name (NAME_MAX):
# neither a preset's name nor a config's path.
MAX_MODEL_CHARS = 4096
MAX_NAME_BYTES = 255


def model_arg(text: str) -> str:
    """--model: a preset's name or a config.json's path, checked before either is looked up
    (a name of 300 or 100,000 characters was the file system's traceback, or printed back)."""
    if (len(text) > MAX_MODEL_CHARS or "\0" in text
            or any(len(part.encode(errors="replace")) > MAX_NAME_BYTES
                   for part in text.split("/"))):
        raise argparse.ArgumentTypeError(
            f"'{shown(text, 40)}' ({len(text):,} characters) is neither a preset name nor a "
            f"path of a config.json (at most {MAX_MODEL_CHARS:,} characters, {MAX_NAME_BYTES} "
            "a part); see infercomm models")
    return text


def commit_text(text: str) -> str:
    """An engine commit (--connector-version): a git hash or a short form of one."""
    if not re.fullmatch(r"[0-9A-Za-z._-]{1,64}", text):
        raise argparse.ArgumentTypeError(f"'{shown(text, 40)}' ({len(text):,} characters) is no "
                                         "commit; give an engine commit such as c8109375")
    return text
