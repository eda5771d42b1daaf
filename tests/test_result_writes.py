"""An --out that cannot take the run is found before the replay, and a write that fails after
it loses nothing it can keep (issue 9, item 4)."""

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.replay_helpers import infercomm, last_json, tiny_model

WRITE_ERROR = 74  # README "Exit status": results measured but not written where asked


def test_an_unwritable_out_is_refused_before_the_replay(tmp_path):
    # /proc/self is a folder in which no file can be created, even by root.
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt",
                        "4", "--decode", "4", "--device", "cpu", "--out", "/proc/self")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""  # no replay ran: no table
    assert proc.stderr.strip().splitlines() == [
        "infercomm replay: error: --out '/proc/self' is not writable (No such file or "
        "directory); pass a writable folder"]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs; skipped where mounting is not allowed (not root, a container...)."""
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_keeps_the_run_elsewhere_and_leaves_no_partial_folder(tmp_path, small_disk):
    # The disk fills while the results are written: 15 of the tmpfs' 16 pages of 4 KiB are
    # taken, so --out passes its probe (one page) and meta.json (about 3.6 KB, one page)
    # fits, and the next file does not. (--timing op's ops.csv beyond the free space is now
    # refused before the replay: test_fault_battery.)
    (small_disk / "filler").write_bytes(b"x" * (15 * 4096))
    spare = tmp_path / "tmp"
    spare.mkdir()
    proc, _ = infercomm("replay", "--model", tiny_model(tmp_path), "--tp", "2", "--prompt", "4",
                        "--decode", "64", "-n", "2", "-w", "0", "--device", "cpu",
                        "--out", str(small_disk), env={"TMPDIR": str(spare)})
    assert proc.returncode == WRITE_ERROR, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("[infercomm]")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"infercomm replay: error: could not write the results into "
                               f"{small_disk}: No space left on device (ENOSPC) at {small_disk}/")
    kept = Path(last_json(proc.stdout)["results_dir"])
    assert kept.parent == spare / "infercomm-unsaved"
    assert f"the results were kept in {kept}" in lines[0]
    assert {p.name for p in kept.iterdir()} == {"meta.json", "iterations.csv", "summary.json"}
    # 1 header + 2 timed inferences (-n 2)
    assert len((kept / "iterations.csv").read_text().splitlines()) == 1 + 2
    assert json.loads((kept / "summary.json").read_text())["kind"] == "replay"
    assert os.listdir(small_disk) == ["filler"]  # no partial .tmp-* folder on the full disk
    assert "communication of one inference" in proc.stdout  # the table was printed too
