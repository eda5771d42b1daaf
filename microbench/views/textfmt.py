"""Plain-text tables and human sizes for terminal output."""

from collections.abc import Iterable, Sequence


def format_bytes(value: float) -> str:
    """Binary units, as nccl-tests and MPI users read sizes: 1.00 MiB, 8.0 KiB, 512 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def format_us(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3f} s"
    if value >= 1e3:
        return f"{value / 1e3:.3f} ms"
    return f"{value:.1f} us"


def render_table(header: Sequence[str], rows: Iterable[Sequence[str]],
                 right_align: set[str] | None = None) -> str:
    rows = [list(r) for r in rows]
    right_align = right_align or set()
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if h in right_align else c.ljust(w)
                         for c, w, h in zip(cells, widths, header, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def plural(n: int, word: str) -> str:
    """'1 request', '2 requests', '1,000 requests'."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")
