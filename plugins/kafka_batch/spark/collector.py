"""Python's cycle collector paused where a process makes many objects that are never in a cycle.

The collector starts a pass every 700 new container objects and walks the ones held since: a module's
import and a read's Messages are exactly such objects, so both paid for passes that found nothing (a
fifth of a read task's CPU, a tenth of a command's imports). Paused, what the block leaves in cycles is
collected at its next pass after the block.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block; on again after it, unless it was off before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
