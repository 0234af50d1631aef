"""`data_plane`: prompts, trajectories and weight versions exchanged with rollout-worker jobs through a
Redis / Valkey broker (docs/data-plane.md)."""

from __future__ import annotations

from typing import Optional

from pydantic import NonNegativeInt, PositiveInt

from dockyard.config.fields import OpenSection, field


class DataPlaneConfig(OpenSection):
    """Extra keys are keyword arguments of the broker's client (redis-py's `redis.Redis`: `password`,
    `username`, `db`, `ssl`, ...); a name it does not take is refused before anything starts."""

    address: Optional[str] = field(None, "host:port (or a redis:// / rediss:// URL) of a running Redis or Valkey "
                                   "server.", "Exactly one of address and start.")
    start: bool = field(False, "The trainer's job starts redis-server on trainer rank 0's node, its append-only "
                        "file under <checkpoint_dir>/data_plane/broker so a requeue loses nothing buffered; its "
                        "address is written to <checkpoint_dir>/data_plane/broker.address for the workers.")
    port: NonNegativeInt = field(0, "Port of the broker `start` runs; 0 picks a free one.")
    namespace: Optional[str] = field(None, "Prefix of the run's keys on the broker; null: dockyard:<name>.")
    weights_dir: Optional[str] = field(None, "Folder the trainer publishes weight versions to, one safetensors "
                                       "folder per version, on a file system the workers' nodes see; null: "
                                       "<checkpoint_dir>/data_plane/weights.")
    buffer_size: PositiveInt = field(1024, "Trajectories out at once (prompts handed out plus groups not yet "
                                     "trained), at most; the pipeline capacity of async GRPO also bounds them.")
    timeout_s: float = field(600.0, "The trainer's wait for a step's groups, and for an unreachable broker, "
                             "before the run ends naming what it waited for.", gt=0)
    claim_after_s: float = field(900.0, "A prompt a worker took and has not answered for this long (it died "
                                 "without saying so) is handed to another worker.", gt=0)
