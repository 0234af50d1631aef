"""The run's side of SWE scoring servers (`env.sandbox_urls`, swe_server.py): the shared secret, and
each patch sent to the least-busy server."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from dockyard.envs.swe_tasks import SweTaskError
from dockyard.errors import ComponentError


class ScoringServerError(ComponentError, RuntimeError):
    """A scoring server did not answer, or answered with an error; the message names it."""


def read_secret(path: str | None) -> str:
    """The run's scoring secret from env.scoring_secret_file; ValueError naming the field when it is
    missing, empty or readable by others."""
    if not path:
        raise ValueError("env.scoring_secret_file: scoring servers (env.sandbox_urls) need a secret shared by the "
                         "run and the servers: a file holding a random string, readable by its owner only "
                         "(`python3 -c 'import secrets; print(secrets.token_hex(32))' > F; chmod 600 F`)")
    file = Path(path)
    try:
        mode = file.stat().st_mode
        secret = file.read_text().strip()
    except OSError as err:
        raise ValueError(f"env.scoring_secret_file: {path} cannot be read ({err.strerror})") from None
    if mode & 0o077:
        raise ValueError(f"env.scoring_secret_file: {path} can be read by others (mode {mode & 0o777:o}); "
                         f"`chmod 600 {path}`")
    if len(secret) < 16:
        raise ValueError(f"env.scoring_secret_file: {path} holds fewer than 16 characters; write a random string")
    return secret


class RemoteScorers:
    """Sends each patch to the least-busy server of env.sandbox_urls."""

    def __init__(self, urls: list[str], timeout_s: float, secret: str):
        self.urls = [url.rstrip("/") for url in urls]
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {secret}"}
        self.in_flight = {url: 0 for url in self.urls}
        self._lock = threading.Lock()

    def score(self, request: dict) -> dict:
        with self._lock:
            url = min(self.urls, key=lambda u: self.in_flight[u])
            self.in_flight[url] += 1
        try:
            response = httpx.post(f"{url}/score", json=request, timeout=self.timeout_s, headers=self.headers)
        except httpx.HTTPError as err:
            raise ScoringServerError(f"scoring server {url} (env.sandbox_urls) did not answer /score: "
                                     f"{type(err).__name__}: {err}") from None
        finally:
            with self._lock:
                self.in_flight[url] -= 1
        if response.status_code in (404, 422):
            raise SweTaskError(f"scoring server {url}: {response.json().get('detail')}")
        if response.status_code != 200:
            raise ScoringServerError(f"scoring server {url} answered /score with {response.status_code}: "
                                     f"{response.text[:300]}")
        return response.json()
