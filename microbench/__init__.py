"""Execution side of infercomm: distributed environment, backends, replay, results, CLI.

torch, mpi4py and cupy are imported lazily, inside the modules that need them, so that a
machine without one of them can still use the others.
"""

__version__ = "0.1.0"
