"""`make chaos`: the fault-injection suite against ground truth (kafka_batch_dev.chaos: the scenarios, the soak,
the harness and the independent checker, a module each).

    python scripts/chaos.py --iterations 3 --records 20000 [--scenarios kill-reading,race] [--json out.json]
    python scripts/chaos.py --scenarios '' --soak 300 --fault-every 15
"""

import sys

from kafka_batch_dev.chaos.cli import main

if __name__ == "__main__":
    sys.exit(main())
