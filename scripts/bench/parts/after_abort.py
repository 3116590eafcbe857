"""The `after-abort` part: an aborted transaction before the position must cost the read nothing (target 10)."""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict

from confluent_kafka import Producer

from bench.env import CONNECT, MODE, Env
from bench.runs import spark_run
from kafka_batch.cli.commands import submit_batch
from kafka_batch_dev import sample_data


def produce_transactions(kafka: dict, topic: str, transactions: list[tuple[int, bool]], seed: int) -> None:
    """Page views in transactions of ONE transactional id, as exactly-once producers write: (records,
    committed) each, spread over the partitions."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": kafka["bootstrap.servers"], "transactional.id": f"{topic}-producer",
                         "linger.ms": 20, "batch.num.messages": 10_000})
    producer.init_transactions(60)
    for count, commit in transactions:
        producer.begin_transaction()
        for _ in range(count):
            key, value = sample_data.page_view(rng)
            sample_data.send(producer, topic, key, json.dumps(value))
        sample_data.flush(producer, topic, 300)
        producer.commit_transaction(120) if commit else producer.abort_transaction(120)


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """A batch over records whose producer aborted a transaction before the position, against one over a
    producer that never aborted (same records, same id pattern, Spark Connect): placing the abort must
    cost the read nothing."""
    planned: dict[str, list] = {}
    for kind, head in (("clean", [(1000, True)]), ("aborted", [(1000, True), (1000, False)])):
        topic = f"{env.prefix}_{kind}"
        sample_data.ensure_topic(env.kafka, topic, args.partitions)
        produce_transactions(env.kafka, topic, head, seed=13)
        pipelines = [env.pipeline(f"{kind}_{i}", topic, CONNECT) for i in range(args.repeat)]
        for pipeline in pipelines:  # the positions past the head, and past its aborted transaction
            submit_batch(pipeline, env.plan(pipeline, "head").id, verbose=False)
        produce_transactions(env.kafka, topic, [(args.after_abort_records, True)], seed=14)
        planned[kind] = [(pipeline, env.plan(pipeline, "measured")) for pipeline in pipelines]
    runs: dict[str, list[dict]] = defaultdict(list)
    for i in range(args.repeat):
        for kind, batches_of_kind in planned.items():
            pipeline, batch = batches_of_kind[i]
            runs[kind].append(spark_run(env, pipeline, batch, f"{kind} producer, {MODE[CONNECT]}",
                                        records=args.after_abort_records))
    best = {kind: min(r["seconds"] for r in rs) for kind, rs in runs.items()}
    return [("10 read after an abort / without >= 0.9, Spark Connect", best["clean"] / best["aborted"], 0.9, ">=")]
