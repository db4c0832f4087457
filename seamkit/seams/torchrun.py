"""The torchrun entry point: one arm of the seams study on the ranks torchrun starts, on one machine
or several (`--nnodes`), joined by torchrun's own rendezvous (`env://`):

    torchrun --nproc-per-node S -m seamkit.seams.torchrun --arm e2e --placement pipe:zbv:8 ...

Rank 0 writes the arm's report and checkpoint. Ctrl-C and SIGTERM act on rank 0 (between steps),
the other ranks follow its word, as under the study's launcher (`seams.launch`).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from typing import Callable

import torch.distributed as dist

from seamkit.config import SeamkitError
from seamkit.seams.launch import TIMEOUT_S, backend_of


def _printer() -> Callable[[dict], None]:
    """A plain line every few seconds from the rank that holds the loss curve."""
    printed = {}

    def emit(e: dict) -> None:
        if e["kind"] == "progress" and (time.monotonic() - printed.get(e["arm"], -1e9) >= 5 or e["fraction"] >= 1):
            printed[e["arm"]] = time.monotonic()
            loss = "-" if e["loss"] is None else f"{e['loss']:.4f}"
            print(f"{e['arm']}: step {e['step']}, loss {loss}, {e['tokens_per_s']:,.0f} tok/s, {e['elapsed_s']:.1f} s",
                  flush=True)
    return emit


def parser():
    from seamkit import config as C
    ap = C.OneLineParser(prog="torchrun ... -m seamkit.seams.torchrun",
                         description="One arm of the seams study on the ranks torchrun starts (--nnodes for several "
                                     "machines); rank 0 writes the arm's report and checkpoint")
    ap.add_argument("--preset", default="cpu", choices=sorted(C.PRESETS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--arm", default="e2e", choices=C.ARMS, help="the arm to run (default e2e)")
    ap.add_argument("--placement", help="its placement over the ranks: dp, pipe:SCHEDULE[:M] or stages "
                                        "(default: stages, dp for e2e; single on one rank)")
    ap.add_argument("--budget", type=float, help="seconds (train.budget_seconds)")
    ap.add_argument("--max-steps", dest="max_steps", type=int, help="train.max_steps")
    ap.add_argument("--seed", type=int, help="train.seed")
    ap.add_argument("--threads", type=int, help="torch threads per rank (train.threads)")
    ap.add_argument("--checkpoint", help="where rank 0 leaves the arm's checkpoint")
    ap.add_argument("--out", default="reports/arm.json", help="the arm's report (rank 0)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """The arm of the command line on this rank of a torchrun job (module docstring)."""
    from seamkit import config as C
    from seamkit.report import provenance, write_json
    from seamkit.seams.arm import ArmSpec, device_of, run_arm
    from seamkit.seams.report import report_arm
    from seamkit.seams.words import on_sigint
    args = parser().parse_args(argv)
    if "RANK" not in os.environ:
        print("seamkit.seams.torchrun: error: run it under torchrun, e.g. torchrun --nproc-per-node 2 -m "
              "seamkit.seams.torchrun --arm local --placement stages", file=sys.stderr)
        return 2
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_sigint if rank == 0 else signal.SIG_IGN)
    code = 0
    try:
        over = C.parse_overrides(args.overrides)
        for flag, key in (("budget", "train.budget_seconds"), ("max_steps", "train.max_steps"),
                          ("seed", "train.seed"), ("threads", "train.threads")):
            if getattr(args, flag) is not None:
                over[key] = getattr(args, flag)
        cfg = C.override(C.preset(args.preset), over)
        default = "single" if world == 1 else "dp" if args.arm == "e2e" else "stages"
        placement = C.parse_placement(args.placement or default)
        if placement.ranks(world) != world:
            raise C.ConfigError(f"--placement {placement} runs on 1 rank; torchrun started {world}")
        spec = ArmSpec(args.arm, cfg, placement, world, args.checkpoint)
        spec.layout  # noqa: B018 -- a placement that cannot run says why on every rank, before any group
        device = device_of(cfg, local)
        faults = None
        if world > 1:
            dist.init_process_group(backend_of(device), init_method="env://",
                                    timeout=datetime.timedelta(seconds=TIMEOUT_S))
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                  timeout=datetime.timedelta(seconds=TIMEOUT_S))
            faults = dist.PrefixStore("seamkit-faults", store)
        result = run_arm(spec, rank, world, emit=_printer(), faults=faults, local_rank=local)
        if rank == 0:
            write_json(args.out, {"arm": report_arm(args.arm, result), "placement": spec.layout.placement.name,
                                  "ranks": world, "nodes": int(os.environ.get("GROUP_WORLD_SIZE", 1)),
                                  **provenance(cfg)})
            print(f"{args.arm} on {spec.layout.placement.name} over {world} ranks: {result.status}, {result.steps} "
                  f"steps, held-out loss {result.final_loss}; report: {args.out}", flush=True)
            code = 0 if result.status == "complete" else 1
        if world > 1:
            dist.barrier()
    except SeamkitError as e:
        print(f"seamkit.seams.torchrun: error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip gloo's teardown (a peer may have gone)


if __name__ == "__main__":
    sys.exit(main())
