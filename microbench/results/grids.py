"""A settings grid's folder (tuning/best.py writes it) is not a run: readers name its runs.

`report`, `compare`, `plot` and `predict --against` read run folders; given a grid's folder
(grid.json and best.csv, no meta.json) they say it is a grid and which runs it holds, so the
user passes one of them (or two, to compare two settings) instead of guessing.
"""

import json
from pathlib import Path

SHOWN = 4  # runs named in the message; the rest counted


def grid_message(folder: Path) -> str | None:
    """The one-line refusal for a grid's folder; None when `folder` holds no grid.json."""
    path = folder / "grid.json"
    if not path.is_file():
        return None
    try:
        grid = json.loads(path.read_bytes().decode("utf-8"))
        runs = [str(r["results_dir"]) for r in grid["runs"]]
    except (OSError, ValueError, TypeError, KeyError):
        return (f"{str(folder)!r} is a settings grid's folder (grid.json) whose grid.json "
                "cannot be read; pass one of its runs, the folders named in it")
    if not runs:
        return f"{str(folder)!r} is a settings grid's folder (grid.json) that holds no run"
    shown = " ".join(runs[:SHOWN]) + (f" (and {len(runs) - SHOWN} more in its grid.json)"
                                      if len(runs) > SHOWN else "")
    noun = "run" if len(runs) == 1 else "runs"
    return (f"{str(folder)!r} is a settings grid (grid.json, best.csv), not a run folder; "
            f"pass one of its {len(runs)} {noun}, or two to compare settings: {shown}")
