"""``python scripts/cloud_run ...`` (the folder run as a script) or ``python -m scripts.cloud_run``."""

import sys
from pathlib import Path

if not __package__:
    # Run as a folder, sys.path[0] is this folder: its modules would shadow top-level names
    # (mcp, flow, ...). The repository root instead, so they are the package scripts.cloud_run.
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from scripts.cloud_run.cli import main

sys.exit(main())
