"""`python scripts/bench`: the bench's parts live in the package beside this file (see __init__)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts/: `bench` and its modules import as one package

from bench.cli import main  # noqa: E402 - after the path it is found on

raise SystemExit(main())
