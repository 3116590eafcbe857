"""A bound on a call into a Kafka client, whatever the client library does with its own timeout.

Some of librdkafka's calls can outlast theirs: `send_offsets_to_transaction` waits for a group
coordinator that left the cluster's metadata until some other broker changes state, past its timeout
(confluentinc/librdkafka#5456, #5511: minutes, or as long as the node is down), and closing a handle has
no timeout at all. `bounded` runs such a call in a daemon thread and waits for it at most its bound;
past the bound the caller gets `Stuck`, a retried ServiceError, and the client is given up: the thread
that is stuck in it keeps it referenced, so its destructor (which would wait on the same coordinator)
runs neither in the caller nor at the interpreter's exit. Nothing else of the process waits for it.

What a stuck call leaves is what a killed attempt leaves: the transactional producer's next attempt
fences it (`init_transactions`) and finds out from the publish group whether the batch was published.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from kafka_batch.errors import ServiceError

T = TypeVar("T")

GRACE_SECONDS = 15.0  # past a call's own timeout: librdkafka's answers come a moment after it


class Stuck(ServiceError):
    """A client call did not return within its bound; the client it was made on is given up."""


def bounded(call: Callable[[], T], seconds: float, what: str) -> T:
    """`call()`'s result or error, if it comes within `seconds`; else `Stuck` naming `what`."""
    outcome: list = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name=f"kafka-batch bounded: {what}", daemon=True).start()
    if not done.wait(seconds):
        raise Stuck(f"{what} did not return within {seconds:g} s (the Kafka client ignored its own timeout);"
                    " this attempt ends, and the next one fences its producer and finds out what it published")
    returned, value = outcome[0]
    if returned:
        return value
    raise value.with_traceback(None)
