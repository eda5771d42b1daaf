"""Disaggregated prefill and decode: two layouts and the KV-cache transfer between them.

    from patterns import resolve_model, Workload, EngineOptions
    from patterns.disagg import parse_disagg, generate_disagg
    d = generate_disagg("vllm", resolve_model("llama-3.1-70b"),
                        parse_disagg("prefill=tp4,decode=tp8"),
                        Workload(prompt=1024, decode=128), EngineOptions())
    d.transfer.total_bytes  # one request's KV moved, every rank pair together
"""

from patterns.disagg.deployment import DisaggPattern, generate_disagg
from patterns.disagg.kvcache import KV_CACHE_DTYPES, SideCache
from patterns.disagg.layouts import (
    CONNECTORS,
    Connector,
    DisaggLayout,
    connector_of,
    parse_disagg,
)
from patterns.disagg.transfer import KVTransfer, Pair, plan_transfer

__all__ = [
    "CONNECTORS",
    "KV_CACHE_DTYPES",
    "Connector",
    "DisaggLayout",
    "DisaggPattern",
    "KVTransfer",
    "Pair",
    "SideCache",
    "connector_of",
    "generate_disagg",
    "parse_disagg",
    "plan_transfer",
]
