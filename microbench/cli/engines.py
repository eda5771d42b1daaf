"""`infercomm engines`: the engine profiles, what each follows and what it leaves out."""

import argparse
import json
from dataclasses import asdict

from microbench.views.textfmt import render_table
from patterns.engines import ENGINE_INFO, OPTION_FLAGS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "engines", help="list the engine profiles, their sources and options",
        description="The engine profiles `--engine` takes: the engine version and source "
                    "commit each follows, the options it reads, and what it does not model.")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="table for people, json for tools (default table)")
    parser.set_defaults(run=run)


def engine_rows() -> list[dict[str, object]]:
    return [{**asdict(info), "options": [OPTION_FLAGS[o] for o in info.options],
             "not_modelled": list(info.not_modelled)}
            for info in sorted(ENGINE_INFO.values(), key=lambda i: i.name)]


def engines_table(rows: list[dict[str, object]]) -> str:
    table = render_table(
        ["engine", "follows", "version", "options"],
        [[str(r["name"]), str(r["engine"]), str(r["version"]),
          " ".join(r["options"]) or "-"] for r in rows])  # type: ignore[arg-type]
    details = []
    for r in rows:
        details.append(f"\n{r['name']}: source {r['source']}")
        details += [f"  not modelled: {item}" for item in r["not_modelled"]]  # type: ignore[attr-defined]
    return table + "\n" + "\n".join(details)


def run(args: argparse.Namespace) -> int:
    rows = engine_rows()
    if args.format == "table":
        print(engines_table(rows))
        # a short last line; the rows are --format json
        print(json.dumps({"engines": [r["name"] for r in rows]}, separators=(",", ":")))
        return 0
    print(json.dumps({"engines": rows}, separators=(",", ":")))
    return 0
