"""The `avro` part: Avro page views through the Schema Registry against the plain consumer and Spark's
readers (targets 9 and 14)."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from bench.env import CONNECT, MODE, SUBMIT, Env
from bench.harness import worst_round
from bench.peers.plain import avro_baseline, baseline_tables
from bench.peers.spark import AVRO_COLUMNS, SPARK_PEERS, peer_run, peer_targets, warm_up_with_peers
from bench.runs import cpu_targets, read_row, spark_run
from kafka_batch_dev import sample_data


def measure(args: argparse.Namespace, env: Env) -> list[tuple]:
    """Avro page views through the Schema Registry (two schema versions) at the small and the big size,
    the whole job (`kafka-batch run`) against a plain consumer decoding with confluent-kafka's
    AvroDeserializer on the same records (run in a fresh process, its interpreter's start not counted)."""
    small = min(args.small, args.avro_records)
    topics = {"small": f"{env.prefix}_avro_small", "big": f"{env.prefix}_avro"}  # a topic of each size, as for JSON
    for size, records in (("big", args.avro_records), ("small", small)):
        sample_data.ensure_topic(env.kafka, topics[size], args.partitions)
        started = time.monotonic()
        sample_data.produce_page_views_avro(env.kafka, {"url": env.registry["url"]}, topics[size], records, seed=12)
        print(f"produced {records:,} Avro records to {topics[size]} in {time.monotonic() - started:.1f}s", flush=True)
    sizes = {"small": f"{small / 1e6:g}M", "big": f"{args.avro_records / 1e6:g}M"}
    jobs = [("small", CONNECT), ("big", CONNECT), ("big", SUBMIT)]
    rounds = [[(f"avro {sizes[size]}, {MODE[spark]}", pipeline, env.plan(pipeline)) for size, spark in jobs
               for pipeline in [env.avro_pipeline(f"avro_{i}_{size}_{spark}", topics[size], spark)]]
              for i in range(args.repeat)]
    ranges = {"small": rounds[0][0][2].ranges, "big": rounds[0][1][2].ranges}
    records = {"small": rounds[0][0][2].span, "big": rounds[0][1][2].span}
    base: dict[str, dict] = {}
    runs: dict[str, list[float]] = defaultdict(list)
    measured: dict[tuple[str, str], dict] = {}  # each job's row by (size, Spark connection)
    warm_up_with_peers(env, lambda i: env.avro_pipeline(f"avro_warm_{i}", topics["small"], CONNECT), ranges["small"],
                       format="avro", group="page,country", registry=env.registry["url"])
    for i, planned in enumerate(rounds):
        for size in ("small", "big"):
            env.tables += baseline_tables(env, f"avro_baseline_{size}_{i}")
            base[size] = read_row(f"avro plain consumer, {sizes[size]}", "consume + AvroDeserializer + dict by (page,"
                                  " country, minute) + CAS commit", avro_baseline, env, ranges[size],
                                  f"avro_baseline_{size}_{i}")
        for (label, pipeline, batch), job in zip(planned, jobs, strict=True):
            run = spark_run(env, pipeline, batch, label)
            runs[label].append(run["seconds"])
            measured[job] = run["row"]
        for (_label, pipeline, batch), size in zip(planned[:2], ("small", "big"), strict=True):
            for peer in SPARK_PEERS:
                runs[f"{peer[0]} Avro {sizes[size]}, {MODE[peer[2]]}"].append(peer_run(
                    env, peer, f"Avro {sizes[size]}", batch.ranges, batch.span, pipeline.sinks[0].table, AVRO_COLUMNS,
                    format="avro", group="page,country", registry=env.registry["url"]))
    best = {label: min(seconds) for label, seconds in runs.items()}

    def ratio(size: str, spark: str) -> float:
        return records[size] / best[f"avro {sizes[size]}, {MODE[spark]}"] / base[size]["value"]

    def against_batch_source(size: str) -> tuple:
        """Issue 68's bar: 1.5x Spark's batch source on the same server in every round."""
        return (f"68 Avro {sizes[size]}: kafka-batch run / Spark batch source >= 1.5 in every round (its worst),"
                f" {MODE[CONNECT]}", worst_round(runs[f"avro {sizes[size]}, {MODE[CONNECT]}"],
                                                runs[f"Spark batch source Avro {sizes[size]}, {MODE[CONNECT]}"]),
                1.5, ">=")

    return [(f"9 avro {sizes['small']}: kafka-batch run / plain consumer >= 1.5, {MODE[CONNECT]}",
             ratio("small", CONNECT), 1.5, ">="),
            (f"9 avro {sizes['big']}: the same >= 2, {MODE[CONNECT]}", ratio("big", CONNECT), 2, ">="),
            (f"9 avro {sizes['big']}: the same >= 1.5, {MODE[SUBMIT]}", ratio("big", SUBMIT), 1.5, ">="),
            *cpu_targets(f"Avro {sizes['small']}", {CONNECT: measured["small", CONNECT]}, base["small"]),
            *cpu_targets(f"Avro {sizes['big']}", {spark: measured["big", spark] for spark in (CONNECT, SUBMIT)},
                         base["big"]),
            against_batch_source("small"), against_batch_source("big"),
            *peer_targets(14, f"Avro {sizes['small']}", {MODE[CONNECT]: best[f"avro {sizes['small']}, {MODE[CONNECT]}"]},
                          best),
            *peer_targets(14, f"Avro {sizes['big']}", {mode: best[f"avro {sizes['big']}, {mode}"]
                                                      for mode in (MODE[CONNECT], MODE[SUBMIT])}, best)]
