"""Many teams, one Airflow: the console shows a user only the pipelines whose DAG Airflow's auth manager
lets that user read, as Airflow's own DAG list does. Two users of the FAB auth manager, each with a role
that may read one pipeline's DAG: over the API a pipeline the user may not read is a 403 that holds none
of its data, and (marker `browser`) a real browser logged in as either sees only that user's pipeline.
"""

from __future__ import annotations

import json
import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest

from kafka_batch_dev import sample_data
from kafka_batch_dev.airflow_api import Server
from tests.airflow.airflow_server import airflow
from tests.airflow.test_console import CHROMIUM, _browser, _number
from tests.integration.helpers import airflow_alone, kafka_config, new_pipeline, run_airflow, run_cli

pytestmark = pytest.mark.integration

FAB = {"AIRFLOW__CORE__AUTH_MANAGER": "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"}


@pytest.fixture(scope="module")
def teams(services, tmp_path_factory):
    """Two pipelines with a committed batch and some lag each; users alice and bob, each in a role that
    may read one of their DAGs (FAB's per-DAG permission), and an Airflow serving them."""
    # Each airflow command spends seconds importing Airflow: those that do not depend on each other overlap.
    with ThreadPoolExecutor() as pool:
        migrated = pool.submit(run_airflow, "db", "migrate", env=FAB)
        pipelines = {}
        for user, records in (("alice", 120), ("bob", 80)):
            pipeline = pipelines[user] = new_pipeline(f"team_{user}", partitions=1)
            sample_data.produce_page_views(kafka_config(), pipeline.topics[0], records, seed=len(user))
            run_cli("run", "--pipeline", pipeline.name)
            sample_data.produce_page_views(kafka_config(), pipeline.topics[0], records // 4, seed=7)  # the lag
        migrated.result()  # FAB's own tables
        run_airflow("dags", "reserialize")
        run_airflow("sync-perm", "--include-dags", env=FAB)  # a permission resource per DAG
        roles = tmp_path_factory.mktemp("fab") / "roles.json"
        roles.write_text(json.dumps([{"name": f"reads_{p.name}", "resource": f"DAG:{p.dag_id}", "action": "can_read"}
                                     for p in pipelines.values()]))
        run_airflow("roles", "import", str(roles), env=FAB)
        password = secrets.token_urlsafe(12)
        # The password is typed at Airflow's prompt (twice), never on a command line `ps` shows.
        for created in [pool.submit(run_airflow, "users", "create", "--username", user,
                                    "--role", f"reads_{pipeline.name}", "--firstname", user, "--lastname", "test",
                                    "--email", f"{user}@example.com", env=FAB, answers=f"{password}\n{password}\n")
                        for user, pipeline in pipelines.items()]:
            created.result()
    with airflow_alone(), airflow(FAB) as server:
        yield {user: Server(server.url, user, password, server.log) for user in pipelines}, pipelines


def _json(server: Server, path: str, token: str) -> tuple[int, dict]:
    status, body = server.get(path, token=token)
    return status, json.loads(body)


def test_a_user_sees_only_the_pipelines_whose_dag_they_may_read(teams):
    servers, pipelines = teams
    for user, server in servers.items():
        own, other = pipelines[user], next(p for u, p in pipelines.items() if u != user)
        token = server.token()
        # Airflow's own DAG list and the console's overview agree: the user's DAG, not the other's.
        status, dags = _json(server, "api/v2/dags?limit=1000", token)
        assert status == 200
        listed = {d["dag_id"] for d in dags["dags"]}
        assert own.dag_id in listed and other.dag_id not in listed
        status, overview = _json(server, "kafka-batch/api/overview", token)
        assert status == 200
        names = {row["name"] for row in overview["pipelines"]}
        assert own.name in names and other.name not in names
        [row] = [r for r in overview["pipelines"] if r["name"] == own.name]
        assert row["lag"] == {"alice": 30, "bob": 20}[user] and row["last_batch"]["status"] == "committed"
        # The other's pipeline: 403 on every endpoint, and nothing of its data in the answer.
        for path in (f"kafka-batch/api/pipelines/{other.name}",
                     f"kafka-batch/api/pipelines/{other.name}/ledger?topic={other.topics[0]}&partition=0"):
            status, body = server.get(path, token=token)
            assert status == 403, (user, path, status)
            assert other.topics[0] not in body and "position" not in body and "batches" not in body
        for path in (f"kafka-batch/api/pipelines/{own.name}",
                     f"kafka-batch/api/pipelines/{own.name}/ledger?topic={own.topics[0]}&partition=0"):
            assert server.get(path, token=token)[0] == 200, (user, path)


@pytest.mark.browser
def test_in_a_browser_each_user_sees_their_pipeline_and_is_refused_the_other(teams, tmp_path):
    sync_playwright = _browser()
    servers, pipelines = teams
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            for user, server in servers.items():
                own, other = pipelines[user], next(p for u, p in pipelines.items() if u != user)
                page = browser.new_context().new_page()
                page.set_default_timeout(60_000)
                page.goto(server.url + "auth/login/")  # FAB's own login form
                page.fill("input[name=username]", user)
                page.fill("input[name=password]", server.password)
                page.click("input[type=submit], button[type=submit]")
                page.wait_for_url(lambda url: "/auth/login" not in url)

                page.goto(server.url + "kafka-batch/")
                page.locator("body[data-loaded='#']").wait_for()
                row = page.locator(f"#pipelines tr[data-pipeline='{own.name}']")
                assert _number(row.locator("td.lag").inner_text()) == {"alice": 30, "bob": 20}[user]
                assert page.locator(f"#pipelines tr[data-pipeline='{other.name}']").count() == 0

                page.goto(server.url + f"kafka-batch/#pipeline={other.name}")
                page.locator("#message", has_text="403").wait_for()
                assert "Not allowed" in page.locator("#message").inner_text()
                assert other.topics[0] not in page.locator("body").inner_text()
                page.screenshot(path=str(tmp_path / f"{user}.png"))
                page.context.close()
        finally:
            browser.close()
