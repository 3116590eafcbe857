"""docker-compose.yml's monitoring agrees with what the project sends (kafka_batch.observability.metrics.METRICS): the
StatsD exporter's mapping names every metric, and the Grafana dashboard queries only those names, with
labels that are their tags. (No Docker here: the files are checked, not run.)"""

from __future__ import annotations

import json
import re

import yaml

from kafka_batch.config import PROJECT_ROOT
from kafka_batch.observability import metrics

MONITORING = PROJECT_ROOT / "monitoring"
COMPOSE = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
STATSD_TYPE = {metrics.COUNTER: "counter", metrics.GAUGE: "gauge", metrics.TIMER: "timer"}


def _exporter_name(stat: str, kind: str, mappings: list[dict]) -> str | None:
    """The Prometheus name the exporter gives a StatsD metric: the first glob rule of its type that
    matches (`*` is one dot-separated part), as statsd_exporter applies its mapping."""
    for rule in mappings:
        if rule.get("match_metric_type", kind) != kind:
            continue
        pattern = "^" + re.escape(rule["match"]).replace(r"\*", "([^.]+)") + "$"
        found = re.match(pattern, stat)
        if found:
            return found.expand(re.sub(r"\$\{(\d+)\}", r"\\g<\1>", rule["name"]))
    return None


def _series() -> dict[str, tuple[str, ...]]:
    """Each Prometheus series name the project's metrics become -> the labels it carries."""
    mapping = yaml.safe_load((MONITORING / "statsd-mapping.yml").read_text())
    prefix = COMPOSE["x-airflow-common"]["environment"]["AIRFLOW__METRICS__STATSD_PREFIX"]
    series = {}
    for metric in metrics.METRICS.values():
        name = _exporter_name(f"{prefix}.{metric.stat}", STATSD_TYPE[metric.kind], mapping["mappings"])
        assert name, f"{metric.stat} falls through the exporter's mapping"
        suffixes = ("_bucket", "_sum", "_count") if metric.kind == metrics.TIMER else ("",)
        series |= {name + s: metric.tags + (("le",) if s == "_bucket" else ()) for s in suffixes}
    return series


def test_compose_sends_airflows_metrics_with_their_tags_to_the_exporter_prometheus_scrapes():
    env = COMPOSE["x-airflow-common"]["environment"]
    services = COMPOSE["services"]
    assert env["AIRFLOW__METRICS__STATSD_ON"] == env["AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED"] == "True"
    exporter = services[env["AIRFLOW__METRICS__STATSD_HOST"]]
    assert f"--statsd.listen-udp=:{env['AIRFLOW__METRICS__STATSD_PORT']}" in exporter["command"]
    scraped = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"][0]
    web = next(a for a in exporter["command"] if a.startswith("--web.listen-address=")).split(":")[-1]
    assert scraped["static_configs"][0]["targets"] == [f"{env['AIRFLOW__METRICS__STATSD_HOST']}:{web}"]
    for service in ("statsd-exporter", "prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            assert (PROJECT_ROOT / volume.split(":")[0]).exists(), volume


def test_every_metric_the_dashboard_queries_is_one_the_project_sends_with_those_labels():
    series = _series()
    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "kafka_batch.json").read_text())
    datasource = yaml.safe_load((MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
                                .read_text())["datasources"][0]
    queries = [(t["expr"], t.get("legendFormat", "")) for p in dashboard["panels"] for t in p["targets"]]
    queries.append((dashboard["templating"]["list"][0]["query"], ""))
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {datasource["uid"]}
    for expr, legend in queries:
        names = re.findall(r"\bkafka_batch_[a-z_]+\b", expr)
        assert names, expr
        for name in names:
            assert name in series, f"{name} is not a series the project sends: {sorted(series)}"
            used = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")}
            used |= set(re.findall(r"\{\{(\w+)\}\}", legend)) | set(re.findall(r"(\w+)=~", expr))
            used |= set(re.findall(r"label_values\([^,]+, (\w+)\)", expr))
            assert used <= set(series[name]), (name, used - set(series[name]))
