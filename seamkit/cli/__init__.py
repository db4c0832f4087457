"""The `seamkit` command: info, train, seams, prune-check, reproduce, findings, data prepare, data
check, sweep, forecast, figures.

Every subcommand builds a RunConfig from a preset plus overrides (the same `config.override`
the notebooks and widgets use), then calls one library function. User errors (a bad config,
a missing or corrupt checkpoint, an empty corpus, an output another run holds...) exit with
status 2 and one line; Ctrl-C exits with 130 (a study or train run stopped by SIGTERM: 143) after
the library has written what it had.
"""

from __future__ import annotations

import argparse
import os
import sys

from seamkit import config as C
from seamkit.cli.common import OutputError, build_config, check_writable
from seamkit.cli.studies import add_findings, add_info, add_prune_check, add_reproduce, add_seams, add_train
from seamkit.cli.tools import add_data, add_figures, add_forecast, add_sweep

__all__ = ["OutputError", "build_config", "check_writable", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    ap = C.OneLineParser(prog="seamkit", description=__doc__.splitlines()[0])  # errors in one line
    sub = ap.add_subparsers(dest="command", required=True)
    for add in (add_info, add_train, add_seams, add_prune_check, add_reproduce, add_findings, add_data, add_sweep,
                add_forecast, add_figures):
        add(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except C.SeamkitError as e:
        print(f"seamkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"seamkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (`| head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
