"""Async GRPO over the data plane (data_plane set): rollout workers are jobs of their own
(plane/worker.py); the trainer's job only trains. Rank 0's step is

    top up prompts -> take B groups as workers deliver them -> filter -> [safe point] -> logprobs
    -> advantages (IS-corrected) -> train -> publish weights (shared folder + announcement)

then the runner's checkpoint, after which the step's groups are acknowledged on the broker (feed.py):
a requeued trainer trains again exactly the groups no checkpoint holds. The step's pieces are the
async loop's (async_grpo.py), minus its in-process rollout driver; the trainer's job runs no
generation server, so there is no validation here (config/constraints/data_plane.py).
"""

from __future__ import annotations

import sys
import time

from dockyard.loop.async_grpo import AsyncGRPOTrainer
from dockyard.loop.trainer import Trainer
from dockyard.plane.broker import Broker, BrokerUnreachable, WaitCancelled
from dockyard.plane.feed import PlaneFeed
from dockyard.plane.weights import WeightPublisher


WORKERS_LEAVE_S = 30   # after the last step: how long the trainer's job keeps the broker for workers to leave


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class DataPlaneGRPOTrainer(AsyncGRPOTrainer):
    def __init__(self, cfg, world, device, replicas, weight_sync_port):
        super().__init__(cfg, world, device, replicas, weight_sync_port)
        self.feed: PlaneFeed | None = None
        self.publisher: WeightPublisher | None = None

    def _generation(self, replicas, weight_sync_port):
        return None, None   # the workers' servers generate; weights reach them through the shared folder

    def server_clients(self) -> list:
        return []

    def serve_latest_weights(self) -> None:
        pass

    def abort_generation(self) -> None:
        pass

    # --- the step -----------------------------------------------------------------------------

    def _trained(self) -> None:
        self.feed.step_trained()   # acknowledged after the next checkpoint

    def _publish(self, weights: dict, step: int, metrics: dict) -> None:
        self.publisher.publish(weights, step)
        metrics["plane/weights_bytes"] = float(self.publisher.last_bytes)

    def _figures(self) -> dict[str, float]:
        return self.feed.figures()

    def _take(self, step: int):
        """Rank 0: the step's groups from the plane, filtered; None when a stop came first."""
        with self.timer("wait"):
            groups = self.feed.take(step - 1, self.cfg.data_plane.timeout_s, lambda: self.stopper.requested)
        if groups is None:
            return None
        kept, dropped = self.collector.keep_groups(groups)
        self.collector.print_samples(groups)
        metrics = self.collector.batch_metrics(groups, kept, dropped)
        metrics["async/lag"] = list(self.feed.last_lags)
        metrics["async/lag_max"] = float(max(self.feed.last_lags))
        # the dataset rows this step trains on: a resumed run can be checked for rows trained twice or lost
        metrics["async/prompt_rows"] = list(self.feed.last_rows)
        return self.payload(kept, metrics)

    # --- checkpoints: the groups a checkpoint holds are acknowledged once it is written ---------

    def _trainer_state(self, metrics: dict[str, float]) -> dict:
        state = Trainer._trainer_state(self, metrics)
        if self.world.is_main and self.feed is not None:
            state["plane"] = self.feed.state()
        return state

    def _save(self, step: int, metrics: dict[str, float]) -> None:
        super()._save(step, metrics)
        if self.world.is_main and self.feed is not None:
            if self.stopper.requested:
                self.feed.broker.cancelled = lambda: True   # a stop does not wait out a broker outage
            try:
                self.feed.acknowledge()
            except (WaitCancelled, BrokerUnreachable):
                if not self.stopper.requested:
                    raise
                _say("dockyard: data plane: the broker does not answer; the checkpoint's groups are "
                     "acknowledged when the run resumes")

    # --- run ----------------------------------------------------------------------------------

    def _run_steps(self, start: int, logger, gpus) -> None:
        weights = self._weights()
        if self.world.is_main:
            broker = Broker(self.cfg, log=_say)
            self.feed = PlaneFeed(self.cfg, broker, self.loaders[0], _say)
            self.feed.open(str(self.cfg.checkpointing.checkpoint_dir), (self.resumed_state or {}).get("plane"))
            self.publisher = WeightPublisher(self.cfg, broker)
            self.publisher.publish(weights, start)   # the fleet starts from the weights training resumes from
            _say(f"dockyard: data plane at {broker.address} (namespace {broker.ns}): {self.feed.live_workers()} "
                 f"rollout worker(s) alive; weights in {self.publisher.root}")
        del weights
        self.published = start
        try:
            Trainer._run_steps(self, start, logger, gpus)
            if self.world.is_main:
                b = self.feed.broker
                b.call("announcing the run's end", lambda: b.redis.hset(b.key("state"), "finished", 1))
                # the broker goes with this job: give the workers a moment to read the news and leave
                deadline = time.monotonic() + WORKERS_LEAVE_S
                while self.feed.live_workers() and time.monotonic() < deadline:
                    time.sleep(0.5)
        finally:
            if self.world.is_main:   # after a stop too: what the saved checkpoint left on the plane
                try:
                    self.feed.broker.cancelled = lambda: True
                    _say(f"dockyard: data plane: {self.feed.accounting()}")
                except (WaitCancelled, BrokerUnreachable):
                    _say(f"dockyard: data plane: the broker at {self.feed.broker.address} does not answer; "
                         "no accounting")
