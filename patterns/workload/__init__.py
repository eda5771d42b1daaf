"""Request workloads: requests read or generated, scheduled as an engine does, turned into
steps whose calls follow each step's token count (`engines.workload_pattern`)."""
