"""Executor-side helpers of a Spark server that runs kafka_batch's read tasks (see `preloaded`).

A package of its own, beside `kafka_batch`, on purpose: the server's daemon imports it from the
server's environment, while the read tasks import `kafka_batch` from the session's artifact. Were
this under `kafka_batch`, the daemon would put the installed `kafka_batch` in every forked worker's
modules, and a worker would run the installed code instead of the batch's own package.
"""
