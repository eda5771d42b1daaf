"""The replay engine: a Pattern bound to buffers and communicators (plan), timed (timing,
replayer, graphs), checked (check), reduced across ranks (aggregate) and written (output).
"""
