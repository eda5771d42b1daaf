"""Result files: run folders written atomically (store), read back as validated pandas
DataFrames (tables, through `load`), and the arrays the commands compute with (runs)."""

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from microbench.results.tables import Results


def load(path: str | Path) -> "Results":
    """A run folder as DataFrames: `.meta` (flattened dict), `.iterations`, `.ops`,
    `.samples`, `.sweep` (None where absent), `.meta_frame`. Raises UsageError on a file
    that is not what replay or sweep writes. pandas is imported here, not before."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        from microbench.argtypes import UsageError

        raise UsageError("reading run folders needs pandas: pip install "
                         "'infercomm[analysis]'") from None
    from microbench.results.tables import Results

    return Results(path)
