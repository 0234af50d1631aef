"""The data plane's broker: a Redis / Valkey server reached with redis-py, or one the trainer's job
starts itself (`data_plane.start`), persisted to the run folder.

Every call goes through `Broker.call`: when the server does not answer, the caller waits (it says
once what it waits for, and again when the server is back) up to data_plane.timeout_s, then ends
with a BrokerUnreachable naming the address. Nothing is retried that may have been applied: redis
transactions (MULTI / EXEC) either ran or did not, and a retried read returns what is still there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

from dockyard.errors import ComponentError

T = TypeVar("T")
RETRY_S = 1.0


class BrokerUnreachable(ComponentError):
    label = "data plane"


class WaitCancelled(Exception):
    """A stop came while a call waited for the broker (not an error: the caller is stopping)."""


def broker_folder(cfg) -> Path:
    return Path(cfg.checkpointing.checkpoint_dir) / "data_plane"


def address_file(cfg) -> Path:
    """Where a started broker's address is written for the workers (on the run's shared file system)."""
    return broker_folder(cfg) / "broker.address"


def namespace(cfg) -> str:
    return cfg.data_plane.namespace or f"dockyard:{cfg.name or 'run'}"


def client_options(cfg) -> dict:
    """data_plane's extra keys: keyword arguments of redis.Redis."""
    return dict(cfg.data_plane.model_extra or {})


def resolve_address(cfg, wait_s: float = 0.0) -> str:
    """The configured address, or a started broker's from its address file (waiting up to wait_s
    for the trainer's job to write it)."""
    plane = cfg.data_plane
    if plane.address:
        return plane.address
    path, deadline = address_file(cfg), time.monotonic() + wait_s
    while True:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        if time.monotonic() >= deadline:
            raise BrokerUnreachable(f"no broker address in {path} (data_plane.start: the trainer's job writes "
                                    f"it when it starts the broker){f'; waited {wait_s:.0f} s' if wait_s else ''}")
        time.sleep(RETRY_S)


class Broker:
    def __init__(self, cfg, address: str | None = None, log: Callable[[str], None] | None = None,
                 who: str = "dockyard"):
        import redis

        self.cfg, self.timeout_s = cfg, cfg.data_plane.timeout_s
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.who = who
        self.fixed_address = address
        self.cancelled: Callable[[], bool] = lambda: False   # a stop ends an outage wait (WaitCancelled)
        self.ns = namespace(cfg)
        self._errors = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionRefusedError)
        self._connect(address or resolve_address(cfg, wait_s=self.timeout_s))

    def _connect(self, address: str) -> None:
        import redis

        self.address = address
        options = {"socket_timeout": 30, "socket_connect_timeout": 5, "decode_responses": True,
                   **client_options(self.cfg)}
        if self.cfg.data_plane.start and "password" not in options and secret_file(self.cfg).is_file():
            options["password"] = secret_file(self.cfg).read_text().strip()
        if "://" in address:
            self.redis = redis.Redis.from_url(address, **options)
        else:
            host, _, port = address.rpartition(":")
            self.redis = redis.Redis(host=host or "127.0.0.1", port=int(port or 6379), **options)

    def key(self, name: str) -> str:
        return f"{self.ns}:{name}"

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """fn() against the broker; waits out an outage up to data_plane.timeout_s."""
        started, warned = time.monotonic(), False
        while True:
            try:
                result = fn()
            except self._errors as err:
                if isinstance(err, redis_auth_errors()):
                    raise BrokerUnreachable(f"the broker at {self.address} refused this client's credentials while "
                                            f"{what} ({err}): data_plane.password / username, or with start: true "
                                            f"the run folder's {secret_file(self.cfg).name}") from None
                waited = time.monotonic() - started
                if self.cancelled():
                    raise WaitCancelled(what) from None
                if waited > self.timeout_s:
                    raise BrokerUnreachable(f"the broker at {self.address} did not answer for {waited:.0f} s "
                                            f"(data_plane.timeout_s) while {what}: {err}") from None
                if not warned:
                    self.log(f"{self.who}: data plane: the broker at {self.address} does not answer ({err}); "
                             f"paused while {what}, waiting up to {self.timeout_s:.0f} s")
                    warned = True
                time.sleep(RETRY_S)
                if self.fixed_address is None and not self.cfg.data_plane.address:
                    # a requeued trainer job starts the broker again, possibly on another node
                    try:
                        fresh = resolve_address(self.cfg)
                    except BrokerUnreachable:
                        fresh = self.address
                    if fresh != self.address:
                        self._connect(fresh)
                continue
            if warned:
                self.log(f"{self.who}: data plane: the broker at {self.address} answers again after "
                         f"{time.monotonic() - started:.0f} s; going on")
            return result

    def close(self) -> None:
        self.redis.close()


def start_broker(cfg, host: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """redis-server for data_plane.start: append-only file in the run folder, fsynced on every write (a
    few writes per group: exactly-once outweighs the cost), so a requeued job that starts it again
    finds every trajectory it had buffered and every acknowledgement it had made. The address is
    written where workers look for it."""
    from dockyard.distributed import free_port

    folder = broker_folder(cfg) / "broker"
    folder.mkdir(parents=True, exist_ok=True)
    port = cfg.data_plane.port or free_port()
    server = _redis_server()
    # it listens on every interface (the workers are on other nodes): only who can read the run folder
    # may write trajectories into the run. The password goes through a file, not the command line (ps)
    conf = folder / "redis.conf"
    conf.touch(mode=0o600)
    conf.write_text(f"requirepass {_secret(cfg)}\n")
    with open(log_path, "a") as out:
        process = subprocess.Popen(
            [server, str(conf), "--port", str(port), "--bind", "0.0.0.0", "--dir", str(folder),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"{host}:{port}"
    partial = address_file(cfg).with_suffix(".tmp")
    partial.write_text(address + "\n")
    partial.replace(address_file(cfg))
    return process, address


def redis_auth_errors() -> tuple:
    import redis

    return (redis.AuthenticationError, redis.exceptions.AuthenticationWrongNumberOfArgsError)


def secret_file(cfg) -> Path:
    return broker_folder(cfg) / "broker.secret"


def _secret(cfg) -> str:
    """The started broker's password: made once per run (a requeued job's broker keeps it), readable by
    the run folder's owner only."""
    import secrets

    path = secret_file(cfg)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.touch(mode=0o600)
        partial.write_text(secrets.token_hex(24))
        partial.replace(path)
    return path.read_text().strip()


def _redis_server() -> str:
    for name in ("valkey-server", "redis-server"):
        for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/usr/sbin"]:
            path = Path(folder) / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    raise BrokerUnreachable("data_plane.start: neither valkey-server nor redis-server is installed on this node "
                            "(apt-get install redis-server, or point data_plane.address at a running one)")


class ManagedBroker:
    """The broker of data_plane.start, run by the trainer's job (`dockyard run`'s driver, or trainer
    rank 0 of a Slurm job on its node): started again on the same port from its append-only file
    should it die (the trainer and the workers wait it out meanwhile), up to RESTARTS times."""

    RESTARTS = 3

    def __init__(self, cfg, host: str, log: Path, say: Callable[[str], None]):
        from dockyard.processes import Child

        self.cfg, self.host, self.log, self.say, self.restarts = cfg, host, log, say, 0
        self.stopped = False
        process, self.address = start_broker(cfg, host, log)
        self.child = Child("data plane broker", process, log)

    def watch(self) -> bool:
        """True while it runs (or was started again); False once it died too often (said why)."""
        from dockyard.processes import Child, log_tail

        code = self.child.process.poll()
        if code is None:
            return True
        if self.stopped:
            return False
        if self.restarts == self.RESTARTS:
            self.say(f"the {self.child.describe()} exited with status {code} after {self.restarts} restarts; "
                     f"stopping the run\n{log_tail(self.log)}")
            return False
        self.restarts += 1
        port = int(self.address.rpartition(":")[2])
        same_port = self.cfg.model_copy(update={"data_plane": self.cfg.data_plane.model_copy(update={"port": port})})
        process, self.address = start_broker(same_port, self.host, self.log)
        self.say(f"the {self.child.describe()} exited with status {code}; started it again at {self.address} "
                 "from its append-only file")
        self.child = Child("data plane broker", process, self.log)
        return True

    def stop(self) -> None:
        from dockyard.processes import stop_processes

        self.stopped = True
        stop_processes([self.child.process], 30)
