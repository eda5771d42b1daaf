"""The options of a request workload (`--requests`) and of speculative decoding, shared by
`pattern`, `replay`, `predict` and `plan` through `pattern_args`."""

import argparse
import sys
from typing import TYPE_CHECKING

from microbench.argtypes import UsageError, positive_float
from patterns import EngineOptions, Layout, resolve_model

if TYPE_CHECKING:
    from patterns.workload.steps import WorkloadPattern


def add_workload_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--requests", default=None, metavar="FILE|poisson:...",
                       help="a request workload instead of one batch: an Azure trace .csv "
                            "(TIMESTAMP,ContextTokens,GeneratedTokens), a Mooncake or plain "
                            ".jsonl ({\"arrival_s\": 0.0, \"prompt\": 100, \"output\": 3}), or "
                            "poisson:rate=R,count=N,prompt=P|LO..HI,output=O|LO..HI,seed=S; the "
                            "engine's scheduler turns it into mixed prefill/decode steps")
    group.add_argument("--step-time-ms", type=positive_float, default=None,
                       help="with --requests: the time of one engine step (compute is not "
                            "modelled), which turns arrival times into steps; needed unless "
                            "every request arrives at 0")
    group.add_argument("--dp-routing", choices=("least-loaded", "round-robin"), default=None,
                       help="with --requests at --dp N: how requests reach the DP ranks "
                            "(default: the engine's front end: vllm least-loaded, its DP load "
                            "balancer's fewest requests in flight; sglang round-robin, its "
                            "DataParallelController's default)")
    group.add_argument("--mixed-chunk", action="store_true",
                       help="sglang with --requests: --enable-mixed-chunk (decodes ride in "
                            "prefill steps)")
    group.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="vllm with --requests: automatic prefix caching (vLLM's "
                            "--enable-prefix-caching), on by default as in vLLM V1: requests "
                            "of one prefix_id compute only what is not cached in whole "
                            "--kv-block-size blocks; --no-prefix-caching: every prompt token "
                            "computed")
    group.add_argument("--speculative-config", default=None, metavar="JSON",
                       help="vllm: speculative decoding, vLLM's flag: '{\"method\": "
                            "\"mtp\"|\"eagle\"|\"eagle3\"|\"ngram\", \"num_speculative_tokens\": "
                            "K}'")
    group.add_argument("--acceptance-length", type=positive_float, default=None,
                       help="with --speculative-config: mean tokens a verify step yields "
                            "(1 .. K+1)")
    group.add_argument("--acceptance-rate", default=None, metavar="R1,...,RK",
                       help="with --speculative-config: per-position acceptance rates as vLLM "
                            "logs them (instead of --acceptance-length)")


def wants_workload(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "requests", None) or getattr(args, "speculative_config", None))


def workload_from_args(args: argparse.Namespace, options: EngineOptions) -> "WorkloadPattern":
    """The WorkloadPattern of --requests (or of one batch under --speculative-config)."""
    from patterns.engines.workloads import workload_pattern
    from patterns.speculative import parse_spec
    from patterns.workload.requests import Request, read_workload
    spec = None
    if args.speculative_config is not None:
        spec = parse_spec(args.speculative_config, args.acceptance_length, args.acceptance_rate)
    elif args.acceptance_length is not None or args.acceptance_rate is not None:
        raise UsageError("--acceptance-length / --acceptance-rate go with --speculative-config")
    if args.requests:
        given = [f for f, v in (("--prompt", args.prompt), ("--decode", args.decode))
                 if v is not None] + (["--batch"] if args.batch != 1 else [])
        if given:
            raise UsageError(f"--requests gives each request's prompt and output; drop "
                             f"{', '.join(given)}")
        requests, unsorted = read_workload(args.requests)
        source = args.requests
    else:  # one batch of identical requests, all arriving at 0
        unsorted = None
        require_prompt_decode(args)
        requests = [Request(0.0, args.prompt, args.decode)] * args.batch
        source = f"batch {args.batch} x prompt {args.prompt}, decode {args.decode}"
    if args.dp_batches is not None:
        raise UsageError("--dp-batches gives each DP rank one batch; with --requests the "
                         "requests are routed to the DP ranks (--dp-routing): drop "
                         "--dp-batches")
    model = resolve_model(args.model)
    if getattr(args, "name", None):
        from dataclasses import replace
        model = replace(model, name=args.name)
    layout = Layout(tp=args.tp, pp=args.pp, dp=args.dp, ep=args.ep)
    if layout.pp > 1 and getattr(args, "command", None) not in ("pattern", "validate", None):
        # vLLM's batch queue at pp > 1 (patterns/engines/vllm/pp_scheduler.py): a pattern
        # to show and check; replay and predict time a workload's steps at pp 1
        raise UsageError(f"{args.command} --requests runs at --pp 1; `infercomm pattern` and "
                         "`validate` take a vLLM workload at --pp > 1")
    step_time_s = None if args.step_time_ms is None else args.step_time_ms / 1e3
    if step_time_s is not None and step_time_s * 1e6 < 1:  # 1e-320 ms: 1e-323 s, denormal
        raise UsageError(f"--step-time-ms {args.step_time_ms:.3g}: an engine step takes at "
                         "least a microsecond (0.001 ms); give the step time your engine "
                         "shows (20-40 ms is common for a 70B model at TP8)")
    pattern = workload_pattern(args.engine, model, layout, requests, args.dtype, options,
                               step_time_s, spec, source, args.mixed_chunk,
                               flag="--requests" if args.requests else "--speculative-config",
                               progress=progress_line if len(requests) >= PROGRESS_FROM
                               else None, dp_routing=getattr(args, "dp_routing", None))
    if unsorted:  # said once the workload is accepted: a refusal stays one line
        sys.stderr.write(f"infercomm: note: {unsorted}\n")
    return pattern


PROGRESS_FROM = 100_000  # requests from which building a workload says how far it is


def progress_line(text: str) -> None:
    """A workload of 10^5 requests or more takes seconds to tens of seconds: say each phase
    on stderr (stdout stays the result)."""
    sys.stderr.write(f"[infercomm] {text}\n")
    sys.stderr.flush()


def require_prompt_decode(args: argparse.Namespace) -> None:
    missing = [f for f, v in (("--prompt", args.prompt), ("--decode", args.decode))
               if v is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or "
                         "--requests FILE|poisson:...)")


def refuse_workload_options(args: argparse.Namespace) -> None:
    """Workload-only options given without --requests / --speculative-config."""
    if wants_workload(args):
        return
    if getattr(args, "prefix_caching", None) is not None:  # its False is given too
        raise UsageError("--prefix-caching / --no-prefix-caching go with --requests: only a "
                         "workload's requests name shared prefixes (prefix_id)")
    if getattr(args, "dp_routing", None) is not None:  # as plan's refuse_alone words it
        raise UsageError("--dp-routing acts only with --requests; add --requests or drop "
                         "--dp-routing")
    for flag in ("--step-time-ms", "--mixed-chunk", "--acceptance-length", "--acceptance-rate"):
        if getattr(args, flag[2:].replace("-", "_"), None):
            raise UsageError(f"{flag} goes with --requests (or --speculative-config for "
                             "--acceptance-*)")
    if getattr(args, "disable_overlap_schedule", False):
        # Not silently ignored: the modes differ only in how a stream of requests is
        # scheduled (patterns/engines/sglang/scheduler.py).
        raise UsageError("--disable-overlap-schedule goes with --requests: a batch pattern lists "
                         "the batch's own steps, the same under either SGLang scheduler; the "
                         "overlap scheduler's extra decode batch and later admissions are "
                         "modelled over a workload")
