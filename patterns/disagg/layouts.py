"""Disaggregated serving: a prefill layout and a decode layout, and the connector between them.

`--disagg prefill=tp4,decode=tp8` names each side's layout (tp, and dp replicas where the
engine allows; pipeline parallelism on either side is not modelled). A request is prefilled
by one DP replica of the prefill side and decoded by one of the decode side; its KV cache
crosses from the prefill replica's TP ranks to the decode replica's TP ranks through the
engine's connector, at the engine commit `--connector-version` names:

- vLLM's NixlConnector (`nixl`): the decode ranks READ (pull) the blocks from the prefill
  ranks. vLLM main of 2026-08-03 (c8109375, public copy modal-projects/vllm),
  `vllm/distributed/kv_transfer/kv_connector/v1/nixl/`: `_read_blocks` posts
  `make_prepped_xfer("READ", ...)` (pull_worker.py:225, 320), one transfer per remote rank of
  a request (`_read_blocks_for_req`, pull_worker.py:126). The older geometry (cda19ecf,
  2026-04-17) is kept: patterns/engines/vllm/nixl_connector.py.
- SGLang's Mooncake (`mooncake`) and NIXL (`nixl`) backends: the prefill ranks WRITE (push)
  into blocks the decode side allocated beforehand. SGLang main of 2026-07-20 (8905cbd4,
  public copy modal-projects/sglang), `python/sglang/srt/disaggregation/`: mooncake/conn.py
  `_send_kvcache_generic` (line 583) and `send_kvcache_slice` (line 715) through
  `batch_transfer_sync`; nixl/conn.py `make_prepped_xfer("WRITE", ...)` (lines 1347, 1567):
  patterns/engines/sglang/disagg_connectors.py.

Which TP rank reads from (or writes to) which, and which refusals the engines make, are in
`patterns/disagg/transfer.py`.
"""

import re
from dataclasses import dataclass, replace

from patterns.errors import ConfigError, shown
from patterns.layout import Layout


@dataclass(frozen=True)
class Connector:
    """One engine's KV connector as the transfer model needs it."""

    engine: str
    name: str
    direction: str  # "read": the decode ranks pull; "write": the prefill ranks push
    library: str
    source: str
    version: str = ""  # the engine commit whose connector is modelled


CONNECTORS: dict[str, dict[str, Connector]] = {
    "vllm": {
        "nixl": Connector("vllm", "nixl", "read", "NIXL",
                          "vLLM NixlConnector (kv_connector/v1/nixl/base_worker.py)"),
        "nixl-push": Connector("vllm", "nixl-push", "write", "NIXL",
                               "vLLM NixlPushConnector (kv_connector/v1/nixl/push_worker.py)"),
    },
    "sglang": {
        "mooncake": Connector("sglang", "mooncake", "write", "Mooncake TransferEngine",
                              "SGLang disaggregation/mooncake/conn.py"),
        "nixl": Connector("sglang", "nixl", "write", "NIXL",
                          "SGLang disaggregation/nixl/conn.py"),
    },
}

# The engine commits whose connectors are modelled (`--connector-version`), newest first:
# the first is the default.
CONNECTOR_VERSIONS: dict[str, tuple[str, ...]] = {
    "vllm": ("c8109375", "cda19ecf"),
    "sglang": ("8905cbd4",),
}

# Connectors an engine has that are not modelled here (said apart from "no such connector").
NOT_MODELLED: dict[str, tuple[str, ...]] = {
    "vllm": ("mooncake", "lmcache", "p2p_nccl"),  # v1/mooncake/, lmcache, p2p/ exist
}

DEFAULT_CONNECTOR = {"vllm": "nixl", "sglang": "mooncake"}

_SIDE = re.compile(r"^(?:(?:tp|dp|pp)[0-9]+)+$")  # ASCII digits: \d takes '２' too
_PART = re.compile(r"(tp|dp|pp)([0-9]+)")
MAX_SIDE_RANKS = 1 << 16  # far beyond one model's deployment


@dataclass(frozen=True)
class DisaggLayout:
    """The two sides of a disaggregated deployment. Job ranks: the prefill side's first
    (its own global order), then the decode side's, offset by the prefill world size."""

    prefill: Layout
    decode: Layout

    @property
    def world_size(self) -> int:
        return self.prefill.world_size + self.decode.world_size

    @property
    def decode_offset(self) -> int:
        return self.prefill.world_size

    def text(self) -> str:
        return f"prefill={side_text(self.prefill)},decode={side_text(self.decode)}"


def side_text(layout: Layout) -> str:
    return f"tp{layout.tp}" + (f"dp{layout.dp}" if layout.dp > 1 else "")


# no side of ours has a number of more digits (MAX_SIDE_RANKS has 5); a message never echoes it
_MAX_DIGITS = 9


def _side(name: str, text: str) -> Layout:
    spec = text.strip().lower()
    said = f"--disagg {name}={shown(text, 40)!r}"  # a message quotes at most 40 characters
    if not _SIDE.match(spec):
        raise ConfigError(f"{said} is not a layout; write it as tpN (and dpM for replicas), "
                          "e.g. prefill=tp4,decode=tp8")
    parts: dict[str, int] = {}
    for key, value in _PART.findall(spec):
        if key in parts:
            raise ConfigError(f"{said} gives {key} twice; give it once")
        if len(value) > _MAX_DIGITS:  # int() of over 4,300 digits raises; none is a size
            raise ConfigError(f"--disagg {name}: {key} of {len(value):,} digits; tp x dp is at "
                              f"most {MAX_SIDE_RANKS:,} ranks a side")
        parts[key] = int(value)
    if parts.get("pp", 1) != 1:
        raise ConfigError(f"{said}: pipeline parallelism on a side of a disaggregated "
                          "deployment is not modelled; use tp (and dp)")
    tp, dp = parts.get("tp", 1), parts.get("dp", 1)
    if tp < 1 or dp < 1 or tp * dp > MAX_SIDE_RANKS:
        raise ConfigError(f"{said}: tp and dp must be positive and tp x dp at most "
                          f"{MAX_SIDE_RANKS:,} ranks")
    return Layout(tp=tp, dp=dp)


def parse_disagg(text: str) -> DisaggLayout:
    """'prefill=tp4,decode=tp8' (either order) -> DisaggLayout."""
    sides: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("prefill", "decode") or key in sides:
            raise ConfigError(f"--disagg {shown(text, 40)!r}: give prefill=LAYOUT,decode=LAYOUT "
                              "once each, e.g. prefill=tp4,decode=tp8")
        sides[key] = value
    if set(sides) != {"prefill", "decode"}:
        raise ConfigError(f"--disagg {shown(text, 40)!r}: give both sides, e.g. "
                          "prefill=tp4,decode=tp8")
    return DisaggLayout(_side("prefill", sides["prefill"]), _side("decode", sides["decode"]))


def connector_of(engine: str, name: str | None, version: str | None = None) -> Connector:
    """The engine's connector by name (None: the engine's usual one) at `version` (None:
    the newest modelled); refuses a connector the engine does not have, one it has that is
    not modelled, and a version not modelled."""
    chosen = _connector(engine, name)
    versions = CONNECTOR_VERSIONS[engine]
    pinned = version if version is not None else versions[0]
    if pinned not in versions:
        raise ConfigError(f"--connector-version {shown(pinned, 40)!r} is not modelled for "
                          f"{engine}; use "
                          f"{' or '.join(versions)} (engine commits, newest first)")
    if chosen.name == "nixl-push" and pinned != versions[0]:
        raise ConfigError(f"vLLM's NixlPushConnector came with #35264 (2026-06-12), after "
                          f"{pinned}; use --connector-version {versions[0]} or --connector nixl")
    return replace(chosen, version=pinned, source=f"{chosen.source} @ {pinned}")


def _connector(engine: str, name: str | None) -> Connector:
    have = CONNECTORS.get(engine)
    if have is None:
        engines = ", ".join(f"{e} ({'/'.join(c)})" for e, c in CONNECTORS.items())
        raise ConfigError(f"engine {engine} has no disaggregated-serving connector modelled; "
                          f"use --engine with one of {engines}")
    chosen = name if name is not None else DEFAULT_CONNECTOR[engine]
    if chosen in have:
        return have[chosen]
    if chosen in NOT_MODELLED.get(engine, ()):
        also = [e for e, c in CONNECTORS.items() if chosen in c]
        elsewhere = f", or --engine {also[0]} for {chosen}" if also else ""
        raise ConfigError(f"{engine}'s {chosen} connector is not modelled; use --connector "
                          f"{'/'.join(have)} with {engine}{elsewhere}")
    others = [e for e, c in CONNECTORS.items() if chosen in c]
    elsewhere = f" ({chosen} is {', '.join(others)}'s)" if others else ""
    raise ConfigError(f"engine {engine} has no {chosen} connector{elsewhere}; use --connector "
                      f"{' or '.join(have)}")
