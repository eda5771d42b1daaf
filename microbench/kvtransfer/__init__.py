"""The KV-cache transfer of disaggregated serving: its CLI options, its view, and its replay
over NIXL, MPI one-sided (RMA), MPI send/recv and torch send/recv."""
