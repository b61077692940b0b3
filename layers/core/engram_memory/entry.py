"""``engram-memory``: the console command, which runs the embedded host's command line and
lets ``admin --stack NAME`` reach a deployed stack through the cloud's operator seat.

The one module above both hosts: the embedded CLI imports only the embedded host and the core,
the cloud's seat is imported only when ``--stack`` is given (and boto3 with it).
"""

from __future__ import annotations

import argparse

from engram_memory.embedded.cli import data_dir_seat
from engram_memory.embedded.cli import main as embedded_main
from engram_memory.operator_plane.seat import OperatorSeat

__all__ = ["main", "open_seat"]


def open_seat(args: argparse.Namespace) -> OperatorSeat:
    """The seat an ``admin`` command names: ``--stack``'s, else ``--data-dir``'s."""
    if getattr(args, "stack", None):
        from engram_memory.cloud.operator import StackSeat

        return StackSeat(args.stack, region=args.region)
    return data_dir_seat(args)


def main(argv: list[str] | None = None) -> int:
    return embedded_main(argv, open_seat=open_seat)


if __name__ == "__main__":
    raise SystemExit(main())
