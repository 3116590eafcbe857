"""A SASL/PLAIN gate in front of the local broker, for the test that Kafka credentials reach every client.

The local broker has no authentication, so this proxy adds it the way a Kafka broker with a
SASL_PLAINTEXT listener does: it advertises SaslHandshake and SaslAuthenticate in its ApiVersions
answer, accepts the PLAIN mechanism with one user and password, and closes any connection that sends
another request before authenticating. Authenticated connections are forwarded to the broker; the
broker's address in Metadata and FindCoordinator answers is rewritten to the gate's, so clients come back
through it. It records, per connection, the client id, whether it authenticated, and the requests sent.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from dataclasses import dataclass, field

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
FETCH, LIST_OFFSETS = 1, 2
ADDRESS_ANSWERS = {3, 10, 60}  # Metadata, FindCoordinator, DescribeCluster: they name the broker
ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 34, 58


@dataclass
class Client:
    client_id: str | None = None
    user: str | None = None  # set once authenticated
    requests: list[int] = field(default_factory=list)  # api keys, in order
    refused: bool = False  # closed for a request before authentication, or a wrong password


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _with_sasl_apis(body: bytes, version: int) -> bytes:
    """An ApiVersions answer (after its correlation id) that also lists SaslHandshake v0-1 and
    SaslAuthenticate v0-2, as a SASL listener's does."""
    (error,) = struct.unpack_from(">h", body, 0)
    if error:
        return body
    flexible = version >= 3
    if flexible:
        count, pos = _uvarint(body, 2)
        count -= 1
    else:
        (count,), pos = struct.unpack_from(">i", body, 2), 6
    entry = 7 if flexible else 6  # key, min, max (+ empty tagged fields)
    entries = [body[pos + i * entry: pos + (i + 1) * entry] for i in range(count)]
    end = pos + count * entry
    ours = {SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 2}
    entries = [e for e in entries if struct.unpack_from(">h", e)[0] not in ours]
    entries += [struct.pack(">hhh", key, 0, top) + (b"\x00" if flexible else b"") for key, top in ours.items()]
    length = _encode_uvarint(len(entries) + 1) if flexible else struct.pack(">i", len(entries))
    return body[:2] + length + b"".join(entries) + body[end:]


def _plain_credentials(request: bytes, version: int) -> tuple[str, str] | None:
    """(user, password) of a SaslAuthenticate request with a PLAIN token (`authzid NUL user NUL password`)."""
    (id_length,) = struct.unpack_from(">h", request, 8)
    pos = 10 + max(id_length, 0)
    if version >= 2:  # flexible header: skip its tagged fields; the token is compact bytes
        tags, pos = _uvarint(request, pos)
        for _ in range(tags):
            _, pos = _uvarint(request, pos)
            size, pos = _uvarint(request, pos)
            pos += size
        size, pos = _uvarint(request, pos)
        size -= 1
    else:
        (size,), pos = struct.unpack_from(">i", request, pos), pos + 4
    parts = request[pos: pos + size].split(b"\x00")
    if len(parts) != 3:
        return None
    return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")


def _authenticate_answer(version: int, error: int, message: str | None) -> bytes:
    if version >= 2:
        text = b"\x00" if message is None else _encode_uvarint(len(message) + 1) + message.encode()
        return b"\x00" + struct.pack(">h", error) + text + b"\x01" + struct.pack(">q", 0) + b"\x00"
    text = struct.pack(">h", -1) if message is None else struct.pack(">h", len(message)) + message.encode()
    return struct.pack(">h", error) + text + struct.pack(">i", 0) + (struct.pack(">q", 0) if version >= 1 else b"")


class SaslGate:
    """`with SaslGate(broker_port, user, password) as gate:` clients connect to 127.0.0.1:gate.port."""

    def __init__(self, broker_port: int, user: str, password: str, host: str = "127.0.0.1"):
        self.host, self.broker_port, self.user, self.password = host, broker_port, user, password
        self.clients: list[Client] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    def __enter__(self) -> SaslGate:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the SASL gate did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, self.host, 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _connection(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        client = Client()
        self.clients.append(client)
        broker_in, broker_out = await asyncio.open_connection(self.host, self.broker_port)
        pending: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version) of answers to rewrite
        answers = asyncio.ensure_future(self._answers(broker_in, client_out, pending))
        try:
            while True:
                size = struct.unpack(">i", await client_in.readexactly(4))[0]
                request = await client_in.readexactly(size)
                api, version, correlation, id_length = struct.unpack_from(">hhih", request)
                client.client_id = request[10: 10 + id_length].decode(errors="replace") if id_length >= 0 else None
                client.requests.append(api)
                if api == SASL_HANDSHAKE:
                    body = struct.pack(">hi", 0, 1) + struct.pack(">h", 5) + b"PLAIN"
                    self._send(client_out, correlation, body)
                elif api == SASL_AUTHENTICATE:
                    credentials = _plain_credentials(request, version)
                    if credentials != (self.user, self.password):
                        client.refused = True
                        self._send(client_out, correlation, _authenticate_answer(
                            version, SASL_AUTHENTICATION_FAILED, "Authentication failed: invalid user or password"))
                        await client_out.drain()
                        return
                    client.user = credentials[0]
                    self._send(client_out, correlation, _authenticate_answer(version, 0, None))
                elif api != API_VERSIONS and client.user is None:
                    client.refused = True  # a SASL listener drops a client that skips authentication
                    return
                else:
                    if api == API_VERSIONS or api in ADDRESS_ANSWERS:
                        pending[correlation] = (api, version)
                    broker_out.write(struct.pack(">i", size) + request)
                    await broker_out.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            answers.cancel()
            broker_out.close()
            client_out.close()

    @staticmethod
    def _send(out: asyncio.StreamWriter, correlation: int, body: bytes) -> None:
        frame = struct.pack(">i", correlation) + body
        out.write(struct.pack(">i", len(frame)) + frame)

    async def _answers(self, broker_in: asyncio.StreamReader, client_out: asyncio.StreamWriter,
                       pending: dict[int, tuple[int, int]]) -> None:
        broker = self.host.encode() + struct.pack(">i", self.broker_port)
        try:
            while True:
                size = struct.unpack(">i", await broker_in.readexactly(4))[0]
                answer = await broker_in.readexactly(size)
                correlation = struct.unpack_from(">i", answer)[0]
                api, version = pending.pop(correlation, (None, None))
                if api == API_VERSIONS:
                    answer = answer[:4] + _with_sasl_apis(answer[4:], version)
                elif api in ADDRESS_ANSWERS:
                    answer = answer.replace(broker, self.host.encode() + struct.pack(">i", self.port))
                client_out.write(struct.pack(">i", len(answer)) + answer)
                await client_out.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            client_out.close()
