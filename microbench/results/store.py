"""Run folders: `<out>/<UTC timestamp>-<label>/`, written atomically, never overwritten."""

import csv
import errno
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from microbench import __version__

# Environment variables that change what a communication library does.
_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "UCX_", "MPIR_CVAR_", "MPICH_", "OMPI_MCA_",
                 "PMIX_MCA_", "PRTE_MCA_", "GLOO_", "FI_", "I_MPI_", "NIXL_", "CUDA_VISIBLE_DEVICES",
                 "OMP_NUM_THREADS", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NTASKS",
                 "SLURM_NNODES", "MASTER_ADDR", "MASTER_PORT")


def relevant_environment() -> dict[str, str]:
    # and whatever a settings grid (sweep/replay --env, tuning/env_grid.py) set, by name
    named = set(filter(None, os.environ.get("INFERCOMM_SETTINGS", "").split(",")))
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(_ENV_PREFIXES) or k in named}


def git_commit() -> str | None:
    source = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--",
                            ":/patterns", ":/microbench"], capture_output=True, text=True,
                           timeout=10, check=False).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def gpu_standin() -> bool:
    """Whether this process runs on the test suite's stand-ins for CUDA, CuPy and NCCL
    (INFERCOMM_GPU_STANDIN=1 in a source checkout, microbench/__init__.py)."""
    import microbench
    return bool(microbench.GPU_STANDIN)


def standin_line(command: str) -> str | None:
    """The first line of a result's output made on the stand-ins, None otherwise: no result
    may pass for a GPU's that touched none."""
    if not gpu_standin():
        return None
    return (f"STAND-IN RESULT: this {command} ran on the test suite's stand-ins for CUDA, CuPy "
            "and NCCL (INFERCOMM_GPU_STANDIN=1), on no GPU; its times are not a GPU's "
            "(meta.json: gpu_standin)")


def print_standin_line(command: str) -> None:
    line = standin_line(command)
    if line is not None:
        print(line)


def base_meta(argv: list[str]) -> dict[str, Any]:
    """What every run records about how and where it ran; `gpu_standin` is true for a run
    made on the test suite's stand-ins (report and compare never mix it with real runs)."""
    return {
        "gpu_standin": gpu_standin(),
        "argv": argv,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "infercomm": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "environment": relevant_environment(),
    }


def csv_text(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    out = io.StringIO()
    columns = columns or (list(rows[0]) if rows else [])
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _slug(label: str) -> str:
    # Cut as --label is (argtypes.MAX_LABEL_CHARS): a default label carries the model's name,
    # which a config.json may make as long as it likes, and a folder name has 255 bytes.
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-")[:120].strip("-") or "run"


# Exit status of a run measured but not written where asked (sysexits' EX_IOERR): apart from
# a failed --check (1), bad input (2) and a rank ended by a signal (128+N).
WRITE_ERROR_EXIT_STATUS = 74


def fallback_dir() -> Path:
    """Where a run goes when its --out cannot take it: the system's temporary folder."""
    return Path(tempfile.gettempdir()) / "infercomm-unsaved"


def write_error_message(command: str, out: str | Path, err: OSError,
                        kept: Path | None) -> str:
    code = errno.errorcode.get(err.errno or 0, "")
    reason = f"{err.strerror or err} ({code})" if code else f"{err.strerror or err}"
    where = err.filename or out
    saved = (f"the results were kept in {kept}" if kept is not None
             else "nothing could be kept; the summary above is all there is")
    return (f"infercomm {command}: error: could not write the results into {out}: {reason} "
            f"at {where}; {saved}\n")


def write_run_or_keep(out_dir: str | Path, label: str,
                      files: dict[str, str | Path]) -> tuple[Path | None, OSError | None]:
    """write_run into `out_dir`; on a write error (a full disk...), into fallback_dir().

    Returns (folder written or None, the error that kept the run out of `out_dir` or None).
    """
    try:
        return write_run(out_dir, label, files), None
    except OSError as err:
        try:
            return write_run(fallback_dir(), label, files), err
        except OSError:
            return None, err


def write_run(out_dir: str | Path, label: str, files: dict[str, str | Path]) -> Path:
    """Write every file into a hidden folder, then rename it into place in one step.

    A reader never sees a half-written run, and an existing run is never replaced: on a name
    clash the new run gets a numeric suffix. On a write error the hidden folder is removed
    and the error (naming the file) is raised: nothing is left on a full disk.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"{stamp}-{_slug(label)}"
    tmp = out / f".tmp-{name}-{os.getpid()}"
    tmp.mkdir()
    try:
        for filename, text in files.items():
            try:
                if isinstance(text, Path):  # a file written beforehand (ops.csv): copy it
                    shutil.copyfile(text, tmp / filename)
                    continue
                with open(tmp / filename, "w") as f:  # close() is where a full disk may show
                    f.write(text)
            except OSError as err:
                # A failed write or close names no file, a failed copy names its source:
                # name the file that could not be written, where it was to be.
                err.filename = str(out / name / filename)
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for attempt in range(1, 1000):
        final = out / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            # rename() of a folder onto an existing non-empty folder fails, never merges
            if final.exists():
                continue
            tmp.rename(final)
            return final
        except OSError:
            continue
    shutil.rmtree(tmp, ignore_errors=True)
    raise FileExistsError(f"no free run folder name for {name} in {out}")


def json_text(document: Any) -> str:
    return json.dumps(document, indent=2, sort_keys=False) + "\n"

