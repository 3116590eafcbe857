"""An editor pointed at the committed schema completes and checks a pipeline file: the YAML language
server that VS Code's YAML extension and JetBrains' LSP clients run, driven over its stdio protocol
with the sample's first line (`# yaml-language-server: $schema=./pipeline.schema.json`).

It needs Node.js and npm (the server comes from the npm registry, into ~/.cache/kafka_batch); missing,
the test fails in CI and is skipped elsewhere, saying so."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from kafka_batch.config import PROJECT_ROOT, Limits, Pipeline, user_cache_dir

SERVER_VERSION = "1.25.0"
MODELINE = "# yaml-language-server: $schema=./pipeline.schema.json"


def _server() -> Path:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        why = f"{' and '.join(missing)} not found: the editor test runs the YAML language server from npm"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    prefix = user_cache_dir() / f"yaml-language-server-{SERVER_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "yaml-language-server"
    if not binary.exists():
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix),
                        f"yaml-language-server@{SERVER_VERSION}"], check=True, timeout=300)
    return binary


class LanguageServer:
    """A minimal LSP client: JSON-RPC with Content-Length framing over the server's stdio."""

    def __init__(self, binary: Path, root: Path):
        self.process = subprocess.Popen([str(binary), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        self.messages: queue.Queue = queue.Queue()
        self.diagnostics: dict[str, list] = {}
        threading.Thread(target=self._read, daemon=True).start()
        self.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(), "capabilities": {}})
        self.notify("initialized", {})
        self.notify("workspace/didChangeConfiguration",
                    {"settings": {"yaml": {"validate": True, "completion": True, "hover": True}}})
        self._id = 1

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            length = None
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if length is None:
                return
            self.messages.put(json.loads(stream.read(length)))

    def _send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def notify(self, method: str, params: dict) -> None:
        self._send({"method": method, "params": params})

    def request(self, method: str, params: dict, timeout: float = 60) -> dict:
        self._id = getattr(self, "_id", 0) + 1
        self._send({"id": self._id, "method": method, "params": params})
        while True:
            message = self.messages.get(timeout=timeout)
            if message.get("method") == "textDocument/publishDiagnostics":
                self.diagnostics[message["params"]["uri"]] = message["params"]["diagnostics"]
            elif "method" in message and "id" in message:  # the server asks (its settings): nothing to add
                items = message.get("params", {}).get("items", [])
                self._send({"id": message["id"], "result": [None] * len(items) if items else None})
            elif message.get("id") == self._id:
                return message.get("result")

    def wait_for_diagnostics(self, uri: str, timeout: float = 60) -> list:
        while uri not in self.diagnostics:
            message = self.messages.get(timeout=timeout)
            if message.get("method") == "textDocument/publishDiagnostics":
                self.diagnostics[message["params"]["uri"]] = message["params"]["diagnostics"]
        return self.diagnostics[uri]

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def editor(tmp_path_factory):
    root = tmp_path_factory.mktemp("editor")
    shutil.copy(PROJECT_ROOT / "pipelines" / "pipeline.schema.json", root / "pipeline.schema.json")
    server = LanguageServer(_server(), root)
    yield server, root
    server.close()


def _open(server: LanguageServer, root: Path, name: str, text: str) -> str:
    path = root / name
    path.write_text(text)
    server.notify("textDocument/didOpen", {"textDocument": {"uri": path.as_uri(), "languageId": "yaml",
                                                            "version": 1, "text": text}})
    return path.as_uri()


def _labels(result) -> set[str]:
    items = result["items"] if isinstance(result, dict) else result
    return {item["label"] for item in items}


def test_the_editor_completes_field_names(editor):
    server, root = editor
    text = f"{MODELINE}\nname: views\n\nlimits:\n  max\n"
    uri = _open(server, root, "complete.yaml", text)
    top = _labels(server.request("textDocument/completion", {"textDocument": {"uri": uri},
                                                             "position": {"line": 2, "character": 0}}))
    assert {info.alias or name for name, info in Pipeline.model_fields.items()} - {"name", "limits"} <= top  # not those given
    inside = _labels(server.request("textDocument/completion", {"textDocument": {"uri": uri},
                                                                "position": {"line": 4, "character": 5}}))
    assert {name for name in Limits.model_fields if name.startswith("max")} <= inside


def test_the_editor_flags_a_misspelled_field_and_passes_the_sample(editor):
    server, root = editor
    sample = (PROJECT_ROOT / "pipelines" / "page_views.yaml").read_text()
    assert server.wait_for_diagnostics(_open(server, root, "sample.yaml", sample)) == []
    misspelled = sample.replace("limits:", "limts:")
    messages = [d["message"] for d in server.wait_for_diagnostics(_open(server, root, "typo.yaml", misspelled))]
    assert any("limts" in m for m in messages), messages
