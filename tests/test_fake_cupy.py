"""The stand-in CuPy's NcclCommunicator against CuPy's own nccl.pyx, when its source is here.

`fake_cupy.NCCL_PYX_SIGNATURES` is read from cupy_backends/cuda/libs/nccl.pyx; this test
reads the .pyx again wherever CuPy's source is at hand (INFERCOMM_CUPY_SOURCE: a source tree
or an sdist such as `pip download cupy --no-deps --no-binary :all:` leaves, or a CuPy
installed from source) so that the table, and the fake built on it, cannot drift from CuPy
silently. Skipped when no source is found.
"""

import importlib.util
import inspect
import os
import re
import tarfile
from pathlib import Path

import pytest

from tests import fake_cupy

PYX = "cupy_backends/cuda/libs/nccl.pyx"


def _pyx_text() -> str | None:
    places = []
    if os.environ.get("INFERCOMM_CUPY_SOURCE"):
        places.append(Path(os.environ["INFERCOMM_CUPY_SOURCE"]))
    spec = importlib.util.find_spec("cupy_backends")
    if spec is not None and spec.submodule_search_locations:
        places.append(Path(next(iter(spec.submodule_search_locations))).parent)
    for place in places:
        if place.is_dir() and (place / PYX).is_file():
            return (place / PYX).read_text()
        if place.is_file() and place.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(place) as tar:
                for member in tar.getmembers():
                    if member.name.endswith(PYX):
                        data = tar.extractfile(member)
                        return data.read().decode() if data is not None else None
    return None


def pyx_signatures(text: str) -> dict[str, tuple[str, ...]]:
    """Method name -> parameter names after self, in the NcclCommunicator class body."""
    body = text[text.index("cdef class NcclCommunicator"):]
    end = re.search(r"\n(?:cdef |cpdef |def |class )", body[1:])
    body = body[:end.start() + 1] if end else body
    found = {}
    for match in re.finditer(r"\n    c?p?def (\w+)\(self\s*,?([^)]*)\)", body):
        params = []
        for part in match.group(2).split(","):
            part = part.split("=")[0].strip()
            if part:
                params.append(part.split()[-1].lstrip("*"))
        found[match.group(1)] = tuple(params)
    return found


def test_the_table_is_the_fake():
    # The fake is CuPy 14: make_modules() says 14.2.0 and takes bytes unique ids.
    for name, params in fake_cupy.NCCL_PYX_SIGNATURES.items():
        method = getattr(fake_cupy.Communicator, name)
        assert tuple(inspect.signature(method).parameters)[1:] == params, name


def test_the_table_matches_cupys_pyx():
    text = _pyx_text()
    if text is None:
        pytest.skip("no CuPy source here (set INFERCOMM_CUPY_SOURCE to a tree or sdist)")
    real = pyx_signatures(text)
    table = (fake_cupy.NCCL_PYX_SIGNATURES if "bytes commId" in text  # CuPy >= 14
             else fake_cupy.NCCL_PYX_SIGNATURES_13)
    for name, params in table.items():
        assert real.get(name) == params, (name, real.get(name))


def test_the_pyx_reader_on_a_snippet_in_cupys_form():
    # Two methods as nccl.pyx writes them (cupy/cupy @ 0fc06191), typed Cython parameters.
    snippet = ("cdef class NcclCommunicator:\n"
               "    def __init__(self, int ndev, tuple commId, int rank):\n        pass\n"
               "    cpdef destroy(self):\n        pass\n"
               "    def send(self, intptr_t sendbuf, size_t count, int datatype, int peer,\n"
               "             intptr_t stream):\n        pass\n"
               "\ncpdef get_version():\n    pass\n")
    assert pyx_signatures(snippet) == {"__init__": ("ndev", "commId", "rank"), "destroy": (),
                                       "send": ("sendbuf", "count", "datatype", "peer",
                                                "stream")}
