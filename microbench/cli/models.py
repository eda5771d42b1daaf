"""`infercomm models`: the presets and the numbers that set their message sizes."""

import argparse
import json

from microbench.views.textfmt import render_table
from patterns import PRESETS
from patterns.shapes import padded_vocab


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="list the model presets and their sources",
                                   description="The model presets, with the config.json "
                                               "each one's numbers come from.")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="table for people, json for tools (default table)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    rows = [{"name": m.name, "hidden_size": m.hidden_size, "num_hidden_layers":
             m.num_hidden_layers, "vocab_size": m.vocab_size, "vocab_padded":
             padded_vocab(m.vocab_size), "num_attention_heads": m.num_attention_heads,
             "num_key_value_heads": m.num_key_value_heads, "intermediate_size":
             m.intermediate_size, "torch_dtype": m.torch_dtype,
             # what patterns use (vLLM's dtype=auto serves an fp32 config as bf16)
             "dtype": m.default_dtype, "experts":
             m.num_local_experts, "source": m.source} for m in PRESETS.values()]
    if args.format == "table":
        header = ["name", "h", "L", "V", "V_pad", "heads", "kv", "inter", "dtype", "experts",
                  "source"]
        keys = ["name", "hidden_size", "num_hidden_layers", "vocab_size", "vocab_padded",
                "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "dtype", "experts", "source"]
        print(render_table(header, [[str(r[k]) for k in keys] for r in rows],
                           right_align={"h", "L", "V", "V_pad", "heads", "kv", "inter",
                                        "experts"}))
        # a short last line; the rows are --format json
        print(json.dumps({"models": [r["name"] for r in rows]}, separators=(",", ":")))
        return 0
    print(json.dumps({"models": rows}, separators=(",", ":")))
    return 0
