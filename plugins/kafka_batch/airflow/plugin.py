"""The kafka-batch console in the Airflow UI: a FastAPI app in the api-server and a navigation entry.

Airflow loads it through the package's `airflow.plugins` entry point, so a `pip install` is all it needs
(no file in Airflow's plugins folder). Importing this module (every Airflow component does) builds
nothing: the app is created on its first request. The page is `/kafka-batch/` on the api-server; the UI
shows it under Browse > Kafka batches.
"""

from airflow.plugins_manager import AirflowPlugin

from kafka_batch.airflow.console import LazyConsole

URL_PREFIX = "/kafka-batch"


class KafkaBatchConsolePlugin(AirflowPlugin):
    name = "kafka_batch_console"
    fastapi_apps = [{"app": LazyConsole(), "url_prefix": URL_PREFIX, "name": "kafka-batch console"}]
    # href is relative: the UI resolves it against its own base URL, so it works behind a proxy prefix.
    external_views = [{
        "name": "Kafka batches",
        "href": URL_PREFIX.lstrip("/") + "/",
        "url_route": "kafka-batch",
        "destination": "nav",
        "category": "browse",
    }]
