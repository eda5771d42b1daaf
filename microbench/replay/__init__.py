"""The replay engine: a Pattern bound to buffers and communicators (plan), timed (timing,
replayer, graphs), checked (check), reduced across ranks (aggregate) and written (output).
"""

# Timing levels (`--timing`): marks per inference, per step, or per call. Here, not in
# replayer.py, so the CLI parser offers them without importing numpy.
LEVELS = ("inference", "step", "op")
