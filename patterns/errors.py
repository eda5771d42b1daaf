"""The one error type of `patterns`: bad input, said in one line."""


class ConfigError(ValueError):
    """A model, layout, workload or engine option that cannot describe a real deployment.

    The message is one line that names what is wrong and what would be right; the CLI prints
    it as is and exits with status 2.
    """
