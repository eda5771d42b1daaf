"""The one error type of `patterns`: bad input, said in one line."""


class ConfigError(ValueError):
    """A model, layout, workload or engine option that cannot describe a real deployment.

    The message is one line that names what is wrong and what would be right; the CLI prints
    it as is and exits with status 2.
    """


def shown(text: str, limit: int = 60) -> str:
    """Text read from a file or the command line as a message may quote it: control
    characters (a terminal's escape sequences among them) written as Python escapes, and cut
    to `limit` characters, so a message never prints a file's raw bytes."""
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit + 1])
    return escaped if len(escaped) <= limit else escaped[:limit - 3] + "..."


def number_text(value: object) -> str:
    """A number as a message quotes it: a count of its digits rather than hundreds of them."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 15:
        # str() of an int over 4,300 digits raises: count the digits from its bits
        return f"a number of about {int(abs(value).bit_length() * 0.30103) + 1:,} digits"
    if isinstance(value, float):
        return f"{value:g}"
    return shown(repr(value)) if not isinstance(value, int) else str(value)


def printable(text: str) -> str:
    """`text` with every control character but the line break escaped (ESC as \\x1b): what a
    command prints of names read from a trace, so that a trace cannot drive the terminal."""
    if text.isprintable():
        return text
    return "\n".join("".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
                     for line in text.split("\n"))
