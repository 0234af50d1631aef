"""The engine client survives a server that closes idle keep-alive connections.

uvicorn closes a connection idle for 5 s; a request sent on it as it closes is answered with a TCP
reset. This server plays that race deterministically: it answers the first request of a connection
and resets the connection when a second one arrives on it.
"""

import json
import socket
import struct
import threading

import httpx
import pytest

from dockyard.generation.client import EngineClient


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head


@pytest.fixture
def reset_on_reuse_server():
    listener = socket.create_server(("127.0.0.1", 0))
    connections = []

    def handle(conn: socket.socket) -> None:
        with conn:
            if not _read_request(conn):
                return
            body = json.dumps({"success": True, "message": "loaded"}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            if conn.recv(65536):   # a second request on this connection: lost the race, reset
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(conn)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", connections
    listener.close()


def test_a_pooled_connection_would_be_reset(reset_on_reuse_server):
    url, _ = reset_on_reuse_server
    with httpx.Client() as pooled:
        assert pooled.post(url + "/update_weights_from_disk", json={}).status_code == 200
        with pytest.raises(httpx.HTTPError):
            pooled.post(url + "/update_weights_from_disk", json={})


def test_engine_client_sends_each_request_on_a_fresh_connection(reset_on_reuse_server):
    url, connections = reset_on_reuse_server
    client = EngineClient(url)
    try:
        for _ in range(3):
            client.load_weights_from_disk("/weights")   # raises on a reset connection
    finally:
        client.close()
    assert len(connections) == 3
