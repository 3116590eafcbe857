"""The console page (an Airflow 3 plugin) in a real Airflow started as `make airflow` starts it: who may
read it, what it says when a broker does not answer, that no response holds a connection detail, that a
DAG triggered through the API runs through the scheduler with nothing listening beyond loopback, that
Airflow's backfill API reads a time-planned pipeline's new intervals and recomputes a committed one, and
(marker `browser`) that a real browser logged in to Airflow shows the positions, lag and batches that
Postgres and Kafka hold.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import time
import urllib.parse
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_batch_dev import local_stack, sample_data
from tests.airflow.airflow_server import airflow
from tests.conftest import FAKE_PASSWORD
from tests.integration.helpers import (
    airflow_alone,
    batches_of,
    create_topic,
    ground_truth,
    kafka_config,
    new_pipeline,
    positions,
    query,
    records_by_partition,
    run_cli,
    run_dag,
    table_contents,
    update_pipeline,
)

pytestmark = pytest.mark.integration

DEAD_KAFKA = "kafka_console_dead"
CHROMIUM = os.environ.get("KAFKA_BATCH_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def pipelines(services):
    """One pipeline with a few committed batches and some lag; one whose broker does not answer."""
    output = f"console_{uuid.uuid4().hex[:8]}_out"  # a Kafka sink too: the page shows what it published
    create_topic(output, 1)
    good = new_pipeline("console", sinks={"kafka": {"topic": output, "value": {"page": "page"}}})
    topic = good.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 300, seed=91)
    run_cli("run", "--pipeline", good.name)
    sample_data.produce_page_views(kafka_config(), topic, 200, seed=92)
    run_dag(good.dag_id, "2026-03-01T00:00:00+00:00")  # a batch of a DAG run: the console links to the run
    sample_data.produce_page_views(kafka_config(), topic, 150, seed=93)  # left unread: the lag
    dead = new_pipeline("consoledead", partitions=1, connections={"kafka": DEAD_KAFKA})
    yield good, dead
    Path(dead.source).unlink()


@pytest.fixture(scope="module")
def server(services, pipelines):
    dead_broker = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{local_stack.free_port()}"}})
    with airflow_alone(), airflow({f"AIRFLOW_CONN_{DEAD_KAFKA.upper()}": dead_broker}) as s:
        yield s


ENDPOINTS = ["kafka-batch/", "kafka-batch/static/console.js", "kafka-batch/api/overview",
             "kafka-batch/api/pipelines/{good}", "kafka-batch/api/pipelines/{good}/ledger?topic={topic}&partition=0"]


def _paths(pipelines) -> list[str]:
    good, _ = pipelines
    return [p.format(good=good.name, topic=good.topics[0]) for p in ENDPOINTS]


def test_every_endpoint_refuses_an_anonymous_request(server, pipelines):
    token = server.token()
    for path in _paths(pipelines):
        status, body = server.get(path)
        assert status == 401, (path, status, body[:300])
        assert server.get(path, token="not-a-jwt")[0] in (401, 403), path
        assert server.get(path, token=token)[0] == 200, path
        assert server.get(path, cookie=token)[0] == 200, path  # the UI's session cookie, as in the iframe


def test_a_broker_that_does_not_answer_is_that_pipelines_error_and_nothing_leaks(server, pipelines):
    good, dead = pipelines
    token = server.token()
    status, body = server.get("kafka-batch/api/overview", token=token)
    assert status == 200, body
    rows = {row["name"]: row for row in json.loads(body)["pipelines"]}
    assert rows[dead.name]["kafka_error"] and "did not answer" in rows[dead.name]["kafka_error"]
    assert rows[dead.name]["lag"] is None
    assert rows[good.name]["kafka_error"] is None and rows[good.name]["error"] is None
    assert rows[good.name]["lag"] == 150

    status, detail = server.get(f"kafka-batch/api/pipelines/{dead.name}", token=token)
    assert status == 200 and json.loads(detail)["kafka_error"]
    bodies = [body, detail] + [server.get(path, token=token)[1] for path in _paths(pipelines)]
    for text in bodies:
        assert FAKE_PASSWORD not in text
        assert "127.0.0.1" not in text and "bootstrap" not in text


@pytest.fixture
def missing_pool(services):
    """A pipeline whose `pool` Airflow does not have (yet), and that pool's name."""
    pool = f"console_pool_{uuid.uuid4().hex[:6]}"
    pooled = new_pipeline("consolepool", partitions=1, pool=pool)
    yield pooled, pool
    Path(pooled.source).unlink()


def test_a_pool_airflow_does_not_have_is_the_pipelines_problem_until_it_is_created(server, pipelines, missing_pool):
    """Airflow 3 leaves a task of a missing pool scheduled forever, said only in the scheduler's log."""
    good, _ = pipelines
    pooled, pool = missing_pool
    token = server.token()

    def pool_errors() -> dict:
        status, body = server.get("kafka-batch/api/overview", token=token)
        assert status == 200, body
        rows = {row["name"]: row["pool_error"] for row in json.loads(body)["pipelines"]}
        status, body = server.get(f"kafka-batch/api/pipelines/{pooled.name}", token=token)
        assert status == 200, body
        assert json.loads(body)["pool_error"] == rows[pooled.name]
        return rows

    try:
        rows = pool_errors()
        assert rows[pooled.name] and f"pool '{pool}' does not exist" in rows[pooled.name], rows[pooled.name]
        assert rows[good.name] is None
        status, body = server.call("POST", "api/v2/pools", {"name": pool, "slots": 2}, token=token)
        assert status == 201, body
        assert pool_errors()[pooled.name] is None
    finally:
        server.call("DELETE", f"api/v2/pools/{pool}", token=token)


def test_admin_connections_offers_the_kafka_and_postgres_forms(server):
    """The providers' connection types are installed, so the UI's connection form offers them."""
    status, body = server.get("ui/connections/hook_meta", token=server.token())
    assert status == 200, body[:500]
    forms = {hook["connection_type"]: hook for hook in json.loads(body)}
    assert {"kafka", "postgres", "spark"} <= set(forms), sorted(forms)
    assert forms["kafka"]["hook_class_name"].endswith("KafkaBaseHook")
    assert forms["postgres"]["hook_class_name"].endswith("PostgresHook")


def _listening(base: Path) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every socket listening in a process the local stack started
    (Postgres, the broker, Airflow's components and their children: task runners, spark-submit, the JVM)."""
    state = local_stack.read_state(base)
    leaders = {state["kafka_pid"], local_stack.postmaster_pid(base / "postgres")}
    leaders |= {entry["pid"] for entry in state.get("airflow", {}).values()}
    ours = local_stack._family(leaders, leaders)
    found = set()
    for conn in psutil.net_connections("inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in ours:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.NoSuchProcess:
                continue
            found.add((name, conn.laddr.ip, conn.laddr.port))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def _unpaused(server, token: str, dag_id: str) -> str:
    """The new pipeline's DAG, once the dag-processor parsed its file, unpaused; its API path."""
    dag = f"api/v2/dags/{dag_id}"
    deadline = time.monotonic() + 120
    while server.get(dag, token=token)[0] != 200:
        assert time.monotonic() < deadline, "the DAG of the new pipeline was never parsed"
        time.sleep(2)
    assert server.call("PATCH", dag, {"is_paused": False}, token=token)[0] == 200
    return dag


def test_a_dag_triggered_through_the_api_runs_on_the_scheduler_listening_on_loopback_only(server, services):
    pipeline = new_pipeline("consoledag", partitions=2, spark_submit=True)
    topic = pipeline.topics[0]
    sample_data.produce_page_views(kafka_config(), topic, 400, seed=95)
    token = server.token()
    dag = _unpaused(server, token, pipeline.dag_id)
    status, body = server.call("POST", dag + "/dagRuns", {"logical_date": None}, token=token)
    assert status == 200, body
    run = f"{dag}/dagRuns/{json.loads(body)['dag_run_id']}"

    base, sockets, state = Path(os.environ["AIRFLOW_HOME"]).parent, set(), None
    deadline = time.monotonic() + 600
    while state not in ("success", "failed"):
        assert time.monotonic() < deadline, f"the DAG run did not end: {state}"
        sockets |= _listening(base)
        state = json.loads(server.get(run, token=token)[1])["state"]
        time.sleep(0.5)
    assert state == "success", server.get(f"{run}/taskInstances", token=token)[1][:3000]
    assert table_contents(pipeline) == ground_truth(topic)
    # Through the scheduler too, the sink table's event carries the batch: its id, kind, exact ranges, counts.
    [(batch_id, records)] = query("SELECT id, records_read FROM kafka_batch.batches WHERE pipeline = %s",
                                  pipeline.name)
    status, body = server.get(f"api/v2/assets/events?source_dag_id={pipeline.dag_id}", token=token)
    assert status == 200, body
    [event] = json.loads(body)["asset_events"]
    stored = positions(pipeline.name)
    assert event["extra"] == {"pipeline": pipeline.name, "batch_id": batch_id, "kind": "batch", "records_read": records,
                              "records_invalid": 0, "ranges": [
                                  {"topic": t, "partition": p, "from_offset": 0, "until_offset": end}
                                  for (t, p), end in sorted(stored.items()) if end]}, event
    # The run's Spark driver was seen listening (the check looked while it ran), and on loopback only.
    assert any(name == "java" for name, _, _ in sockets), sockets
    assert {s for s in sockets if not _loopback(s[1])} == set(), sockets


def _wait_for_runs(server, token: str, dag_id: str, count: int, timeout: float = 600) -> list[dict]:
    """The DAG's runs once `count` of them ended, each a success."""
    deadline = time.monotonic() + timeout
    while True:
        runs = json.loads(server.get(f"api/v2/dags/{dag_id}/dagRuns?limit=100", token=token)[1])["dag_runs"]
        ended = [r for r in runs if r["state"] in ("success", "failed")]
        if len(ended) >= count and len(ended) == len(runs):
            assert all(r["state"] == "success" for r in runs), runs
            return runs
        assert time.monotonic() < deadline, runs
        time.sleep(1)


def test_airflows_backfill_of_a_pipeline_planned_by_time_reads_new_intervals_and_recomputes_exactly_one(
        server, services):
    # Through Airflow's own backfill API and scheduler. The schedule fires at four past hours only: the one
    # run the scheduler makes itself (catchup off, when the DAG is unpaused) is of the last of them, before
    # any record, and none comes while the test runs; the records are in the first two.
    hour = 3_600_000
    h0 = (int(time.time() * 1000) // hour - 5) * hour
    hours = ",".join(str((h0 // hour + n) % 24) for n in range(4))
    pipeline = new_pipeline("backfill", plan_by="time", schedule=f"0 {hours} * * *")
    topic = pipeline.topics[0]
    token = server.token()
    _unpaused(server, token, pipeline.dag_id)
    _wait_for_runs(server, token, pipeline.dag_id, 1)  # the scheduler's own run: no record yet
    for n in range(2):  # 200 records in each of two hours, 15 s apart
        sample_data.produce_page_views(kafka_config(), topic, 200, seed=130 + n, start_ms=h0 + n * hour,
                                       spacing_ms=15_000)

    def backfill(start_ms: int, end_ms: int, reprocess: str) -> None:
        """A backfill through Airflow's API, waited for until Airflow says it completed."""
        at = [datetime.fromtimestamp(ms / 1000, UTC).isoformat() for ms in (start_ms, end_ms)]
        status, body = server.call("POST", "api/v2/backfills", {
            "dag_id": pipeline.dag_id, "from_date": at[0], "to_date": at[1], "reprocess_behavior": reprocess,
            "max_active_runs": 1}, token=token)
        assert status == 200, body
        backfill_id = json.loads(body)["id"]
        deadline = time.monotonic() + 600
        while not json.loads(server.get(f"api/v2/backfills/{backfill_id}", token=token)[1]).get("completed_at"):
            assert time.monotonic() < deadline, batches_of(pipeline.name)
            time.sleep(1)

    # The two intervals not read yet: read in order, a batch each, up to each interval's end.
    backfill(h0, h0 + hour, "none")
    _wait_for_runs(server, token, pipeline.dag_id, 3)
    assert table_contents(pipeline) == ground_truth(topic)
    batches = query("SELECT id, kind, status FROM kafka_batch.batches WHERE pipeline = %s AND status = 'committed'"
                    " ORDER BY id", pipeline.name)
    assert [kind for _, kind, _ in batches] == ["batch", "batch"]
    second = batches[1][0]
    second_hour = query("SELECT partition, from_offset, until_offset FROM kafka_batch.batch_ranges WHERE batch_id = %s"
                        " ORDER BY partition", second)
    records = records_by_partition(topic)
    assert second_hour == [(p, next(o for o, ts in rs if ts >= h0 + hour), rs[-1][0] + 1)
                           for p, rs in sorted(records.items()) if rs]  # exactly the second hour's records

    # The definition changes (a view now counts twice); a backfill of the second hour, completed runs
    # included, recomputes exactly its range with it: the first hour's totals stay as they were.
    good = pipeline.definition["sinks"]
    pipeline = update_pipeline(pipeline.name, sinks={**good, "aggregate": {**good["aggregate"], "measures": {
        **good["aggregate"]["measures"], "views": "2"}}})
    backfill(h0 + hour, h0 + hour, "completed")  # its tasks parse the pipeline's file as it is now
    _wait_for_runs(server, token, pipeline.dag_id, 3)
    [(replay,)] = query("SELECT id FROM kafka_batch.batches WHERE pipeline = %s AND kind = 'replay'", pipeline.name)
    assert query("SELECT partition, from_offset, until_offset FROM kafka_batch.batch_ranges WHERE batch_id = %s"
                 " ORDER BY partition", replay) == second_hour
    second_hours = ground_truth(topic, select=lambda p, o: any(p == q and a <= o < b for q, a, b in second_hour))
    assert table_contents(pipeline) == {key: (views + second_hours.get(key, (0, 0))[0], duration)
                                        for key, (views, duration) in ground_truth(topic).items()}


def _last_stable_offsets(topic: str, partitions: list[int]) -> dict[int, int]:
    """The end of each partition, asked with a plain consumer (read_committed), not the project's code."""
    consumer = Consumer({"bootstrap.servers": kafka_config()["bootstrap.servers"], "group.id": "console-test",
                         "isolation.level": "read_committed"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    finally:
        consumer.close()


def _browser():
    """Playwright driving Debian's Chromium; missing in CI is a failure, elsewhere a skip."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = ("the playwright package is not installed" if sync_playwright is None
               else None if shutil.which(CHROMIUM) or Path(CHROMIUM).exists()
               else f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or `make test` does it)")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser test cannot run in CI: {missing}")
        pytest.skip(missing)
    return sync_playwright


@pytest.mark.browser
def test_the_page_in_the_airflow_ui_shows_what_postgres_and_kafka_hold(server, pipelines, missing_pool, tmp_path):
    sync_playwright = _browser()
    good, _ = pipelines
    pooled, pool = missing_pool
    topic = good.topics[0]
    stored = positions(good.name)
    ends = _last_stable_offsets(topic, sorted(p for _, p in stored))
    batches = batches_of(good.name)
    assert len(batches) == 2 and sum(ends.values()) - sum(stored.values()) == 150

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            # Logged out, the console is refused.
            response = page.goto(server.url + "kafka-batch/api/overview")
            assert response.status == 401
            # Log in with Airflow's own form (simple auth manager).
            page.goto(server.url + "auth/login")
            page.fill("input[name=username]", server.username)
            page.fill("input[name=password]", server.password)
            page.click("button[type=submit]")
            page.wait_for_url(lambda url: "/auth/login" not in url)

            # Airflow's menu opens the console (Browse > Kafka batches); the overview lists the pipeline.
            page.goto(server.url)
            page.get_by_role("button", name="Browse").click()
            page.get_by_role("menuitem", name="Kafka batches").click()
            page.wait_for_url(lambda url: "/plugin/kafka-batch" in url)
            frame = page.frame_locator("iframe[title='Kafka batches']")
            row = frame.locator(f"#pipelines tr[data-pipeline='{good.name}']")
            assert _number(row.locator("td.lag").inner_text()) == 150
            assert "batch" in row.locator("td.last-batch").inner_text()
            assert row.locator("td.problem").inner_text() == ""
            problem = frame.locator(f"#pipelines tr[data-pipeline='{pooled.name}'] td.problem").inner_text()
            assert f"pool '{pool}' does not exist in Airflow" in problem, problem

            row.locator("a.pipeline-link").click()
            frame.locator("body[data-loaded^='#pipeline=']").wait_for()
            # Per topic first: its partitions, its lag and the partitions most behind, by lag.
            lags = {partition: ends[partition] - position for (_, partition), position in stored.items()}
            [topic_name] = {t for t, _ in stored}
            totals = frame.locator(f"#topics tr[data-topic='{topic_name}']")
            assert _number(totals.locator("td.partitions").inner_text()) == len(stored)
            assert _number(totals.locator("td.lag").inner_text()) == sum(lags.values())
            most = sorted((p for p in lags if lags[p]), key=lambda p: -lags[p])
            assert totals.locator("td.worst").inner_text() == (
                ", ".join(f"{p} ({lags[p]:,})" for p in most) or "–")
            assert frame.locator("#partitions-section").get_attribute("open") is not None  # two: listed at once
            for (t, partition), position in stored.items():
                cells = frame.locator(f"#partitions tr[data-topic='{t}'][data-partition='{partition}']")
                shown = {name: _number(cells.locator(f"td.{name}").inner_text())
                         for name in ("position", "last-stable", "lag")}
                assert shown == {"position": position, "last-stable": ends[partition],
                                 "lag": ends[partition] - position}, (partition, shown)
            rows = frame.locator("#batches tbody tr")
            assert rows.count() == len(batches)
            for batch_id, _kind, status, _run_id, records, _error in batches:
                cells = frame.locator(f"#batches tr[data-batch-id='{batch_id}']")
                assert cells.locator("td.status").inner_text() == status == "committed"
                assert _number(cells.locator("td.records").inner_text()) == records
            assert sum(r[4] for r in batches) == 500
            sink = frame.locator(f"#kafka-sinks tr[data-topic='{good.sinks[1].topic}']")
            assert _number(sink.locator("td.last-published").inner_text()) == max(r[0] for r in batches)
            assert sink.locator("td.open-transactions").inner_text() == "none"
            bars = frame.locator("#chart-svg rect[data-batch-id]")
            assert [int(bars.nth(i).get_attribute("data-records")) for i in range(bars.count())] == [r[4] for r in batches]
            assert frame.locator("#ledger tbody tr.live").count() == 2  # both batches read partition 0
            assert "kafka-batch replay --pipeline" in frame.locator("#ledger code.replay-cli").first.inner_text()

            page.set_viewport_size({"width": 1200, "height": 760})
            shot = Path(os.environ.get("KAFKA_BATCH_CONSOLE_SCREENSHOT") or tmp_path / "console.png")
            page.screenshot(path=str(shot))
            assert shot.stat().st_size < 200_000

            # Times as Airflow shows them: 24-hour, in the timezone chosen in Airflow's UI (kept in local
            # storage); a zone the browser does not know is the browser's own, not a console that breaks
            # (Airflow's own page does not load then: the console is opened alone).
            for chosen, opened in (("Not/A_Zone", "kafka-batch/"), ("Asia/Tokyo", "plugin/kafka-batch")):
                page.evaluate("zone => localStorage.setItem('timezone', JSON.stringify(zone))", chosen)
                page.goto(server.url + opened)
                frame = page.frame_locator("iframe[title='Kafka batches']") if opened.startswith("plugin") else page
                frame.locator("body[data-loaded]").wait_for(state="attached")
                shown = re.fullmatch(r"as of ([01]\d|2[0-3]):[0-5]\d:[0-5]\d (\S+)", frame.locator("#updated").inner_text())
                assert shown and (shown[2] == chosen) == (chosen == "Asia/Tokyo"), shown
                assert frame.locator(f"#pipelines tr[data-pipeline='{good.name}']").count() == 1
            page.evaluate("localStorage.removeItem('timezone')")

            # Its links open Airflow's pages in Airflow's window (the iframe may not navigate the top one):
            # the pipeline's DAG, the DAG run of a batch, the replay DAG (whose Trigger takes the params).
            # The console makes every such link alike (console.js, airflowLink: target _top), so each one's
            # address is checked and the last is followed (a page of Airflow's UI costs seconds of CPU).
            [(run_id,)] = query("SELECT run_id FROM kafka_batch.batches WHERE pipeline = %s AND dag_id IS NOT NULL",
                                good.name)
            links = [  # (on the pipeline's page, the link, where it leads)
                (False, f"#pipelines tr[data-pipeline='{good.name}'] a.dag-link", f"/dags/{good.dag_id}"),
                (True, "#batches a.run-link", f"/dags/{good.dag_id}/runs/{run_id}"),
                (True, "#ledger a.replay-link", f"/dags/{good.dag_id}__replay"),
            ]

            def leads_to(path):
                return lambda url: urllib.parse.unquote(urllib.parse.urlsplit(url).path).rstrip("/").endswith(path)

            # The last zone's page is open still: Airflow's, with the console's overview.
            for on_pipeline_page, link, path in links:
                if on_pipeline_page and not frame.locator("body[data-loaded^='#pipeline=']").count():
                    frame.locator(f"#pipelines tr[data-pipeline='{good.name}'] a.pipeline-link").click()
                    frame.locator("body[data-loaded^='#pipeline=']").wait_for()
                anchor = frame.locator(link).first
                assert anchor.get_attribute("target") == "_top", link
                assert leads_to(path)(anchor.evaluate("a => a.href")), (link, anchor.evaluate("a => a.href"))
            _, followed, path = links[-1]  # the replay DAG's
            frame.locator(followed).first.click()
            page.wait_for_url(leads_to(path))
            assert page.locator("iframe[title='Kafka batches']").count() == 0  # Airflow's page, not the console
            page.get_by_role("button", name="Trigger").first.wait_for()  # the replay DAG's page

            # Its Trigger form, filled as a user would: a partition, times through Airflow's date-time
            # picker (in the timezone the UI shows, UTC here) around every record of the partition; a dry run.
            # What the picker sends must be a time the plan task accepts (with its zone): the run previews
            # exactly the committed ranges those times overlap.
            records = records_by_partition(topic)[0]
            minute = 60_000
            window = [min(ts for _, ts in records) // minute * minute, (max(ts for _, ts in records) // minute + 1) * minute]
            page.get_by_role("button", name="Trigger").first.click()
            form = page.locator("[role=dialog][data-scope=dialog][data-state=open]")
            form.get_by_text("Run Parameters").wait_for()
            form.locator("textarea[name=element_partitions]").fill("0")
            for name, ms in zip(("from_time", "until_time"), window, strict=True):
                form.get_by_text(name, exact=True).locator("xpath=../..").get_by_test_id("datetime-input").click()
                picker = page.locator("[role=dialog][data-scope=popover][data-state=open]").last
                assert picker.get_by_text("UTC", exact=True).count() == 1  # the zone it reads the time in
                at = datetime.fromtimestamp(ms / 1000, UTC)
                picker.get_by_placeholder("YYYY/MM/DD").fill(at.strftime("%Y/%m/%d"))
                picker.get_by_placeholder("HH:mm").fill(at.strftime("%H:%M"))
                # A click outside closes the picker: on the dialog's title (the "Run Parameters" header would
                # fold the form away).
                form.get_by_text(f"Trigger Dag - {good.dag_id}__replay").click()
                picker.wait_for(state="hidden")
            form.locator("input[name=element_reason]").fill("the browser test's replay")
            with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/dagRuns")) as sent:
                form.get_by_role("button", name="Trigger").click()
            run = sent.value.json()
            assert [run["conf"]["from_time"], run["conf"]["until_time"]] == [
                datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:00.000Z") for ms in window], run["conf"]
        finally:
            browser.close()
    token = server.token()
    path = f"api/v2/dags/{good.dag_id}__replay/dagRuns/{urllib.parse.quote(run['dag_run_id'])}"
    deadline = time.monotonic() + 600
    while (state := json.loads(server.get(path, token=token)[1])["state"]) not in ("success", "failed"):
        assert time.monotonic() < deadline, f"the replay run did not end: {state}"
        time.sleep(1)
    assert state == "success", server.get(f"{path}/taskInstances", token=token)[1][:3000]
    [(replay, kind, status)] = query("SELECT id, kind, status FROM kafka_batch.batches WHERE pipeline = %s AND run_id = %s",
                                     good.name, run["dag_run_id"])
    assert (kind, status) == ("replay", "previewed")
    committed = query("SELECT r.from_offset, r.until_offset FROM kafka_batch.batch_ranges r JOIN kafka_batch.batches b"
                      " ON b.id = r.batch_id WHERE b.pipeline = %s AND b.kind = 'batch' AND r.partition = 0"
                      " AND r.until_offset > r.from_offset ORDER BY 1", good.name)
    assert query("SELECT partition, from_offset, until_offset FROM kafka_batch.batch_ranges WHERE batch_id = %s"
                 " ORDER BY from_offset", replay) == [(0, a, b) for a, b in committed]
    assert committed[0][0] == 0 and committed[-1][1] == stored[(topic, 0)]  # every committed record of partition 0


def _number(text: str) -> int:
    return int(text.replace(",", "").strip())
