"""The async GRPO loop: generation runs ahead of training (grpo.async_grpo.enabled).

Rank 0's RolloutDriver keeps the rollout fleet busy in a thread of its own; the trainer's step is

    take B finished groups -> filter -> logprobs -> advantages (IS-corrected) -> train -> publish weights

and never waits for the fleet to drain: the driver installs each published version between
requests (rollout_driver.py), and what was sampled by older weights is corrected by importance
sampling against the sampler's own logprobs (loss_fn.is_correction, mandatory). Lag, capacity and
the window strategies: rollout_window.py. The step's pieces (advantages, loss) are the sync loop's
(grpo.py); policy, checkpoints and validation are every loop's (trainer.py).
"""

from __future__ import annotations

import sys
import time

from dockyard.config.constraints.async_loop import async_grpo as async_rules
from dockyard.config.errors import ConfigError
from dockyard.loop.grpo import GRPOTrainer
from dockyard.loop.stopping import RunStopped
from dockyard.loop.trainer import serving_precision
from dockyard.preflight.components import unsupported
from dockyard.loop.rollout_driver import RolloutDriver
from dockyard.models import DTYPES


class AsyncGRPOTrainer(GRPOTrainer):
    def __init__(self, cfg, world, device, replicas, weight_sync_port):
        # the async rules hold at run time too, not only when the config was validated
        problems = list(async_rules(cfg)) + unsupported(cfg)
        if problems:
            raise ConfigError(problems)
        super().__init__(cfg, world, device, replicas, weight_sync_port)
        self.driver: RolloutDriver | None = None
        self.published = 0

    # --- weights ------------------------------------------------------------------------------

    def _weights(self) -> dict:
        """Every rank gathers; rank 0 gets a copy the next optimizer step cannot change under the driver."""
        weights = self.policy.serving_weights(DTYPES[serving_precision(self.cfg)])
        return {name: tensor.clone() for name, tensor in weights.items()}

    def serve_latest_weights(self) -> None:
        """Before validation: wait until the driver installed the version just published."""
        if self.world.is_main and self.driver is not None:
            self.driver.wait_version(self.published, self.cfg.grpo.sampler.rollout_timeout_s)

    def abort_generation(self) -> None:
        if self.driver is not None:
            self.driver.abort()

    # --- the step -----------------------------------------------------------------------------

    def train_step(self, step: int) -> dict[str, float]:
        self.timer.seconds = {}
        started = time.perf_counter()
        if self.world.is_main:
            self.collector.step = step   # names the trajectory dump files of what is sampled from now on
        payload = self._take(step) if self.world.is_main else None
        payload = self._broadcast(payload)
        self.safe_point(batch_missing=payload is None)
        samples, rewards, metrics = payload
        metrics.update(self.learn(step, samples, rewards))
        if self.world.is_main:
            self._trained()
        with self.timer("refit"):
            weights = self._weights()
            if self.world.is_main:
                self._publish(weights, step, metrics)
            self.published = step
        if self.world.is_main:
            metrics.update(self._figures())
        phases = dict(self.timer.seconds)
        metrics["train/tokens_per_s"] = sum(len(s.token_ids) for s in samples) / (time.perf_counter() - started)
        metrics["async/trainer_idle_seconds"] = phases.get("wait", 0.0)
        return metrics | {f"time/{name}": seconds for name, seconds in phases.items()}

    def _trained(self) -> None:
        """Rank 0: the step's groups are trained (they leave the replay set)."""
        self.driver.commit()

    def _publish(self, weights: dict, step: int, metrics: dict) -> None:
        """Rank 0: the weights after `step` go to the fleet."""
        self.driver.publish(weights, step)

    def _figures(self) -> dict[str, float]:
        return self.driver.figures()

    def _take(self, step: int):
        """Rank 0: the step's groups from the driver, filtered; None when a stop came first."""
        with self.timer("wait"):
            groups = self.driver.take(step - 1, self.cfg.grpo.sampler.rollout_timeout_s,
                                      lambda: self.stopper.requested)
        if groups is None:
            return None
        kept, dropped = self.collector.keep_groups(groups)
        self.collector.print_samples(groups)
        metrics = self.collector.batch_metrics(groups, kept, dropped)
        every = [t for g in groups for t in g.trajectories]
        # what the sampler generated: with masked off-policy tokens the loss mask undercounts it
        metrics["gen/generated_tokens"] = float(sum(sum(v >= 0 for v in t.versions or []) for t in every))
        metrics["gen/mean_response_tokens"] = metrics["gen/generated_tokens"] / len(every)
        metrics["async/lag"] = list(self.driver.last_lags)   # per group: versions between sampling and training
        metrics["async/lag_max"] = float(max(self.driver.last_lags))
        # the dataset rows this step trains on: a resumed run can be checked for rows trained twice or lost
        metrics["async/prompt_rows"] = [ticket.row for ticket in self.driver.taken]
        metrics.update(self.fleet.take_request_seconds())   # the driver's calls since the last step
        return self.payload(kept, metrics)

    def payload(self, kept: list, metrics: dict):
        """What every rank receives for the step: samples, rewards, metrics."""
        trajectories = [t for g in kept for t in g.trajectories]
        return [t.sample for t in trajectories], [t.reward for t in trajectories], metrics

    # --- run ----------------------------------------------------------------------------------

    def _trainer_state(self, metrics: dict[str, float]) -> dict:
        state = super()._trainer_state(metrics)
        if self.world.is_main and self.driver is not None:
            # the loader's position and the replayed rows from one moment: the driver draws meanwhile
            drawn = self.driver.state()
            state["loaders"], state["async"] = [drawn["loader"]], drawn
        return state

    def _snapshot(self) -> dict:
        return {}   # the driver keeps what a dropped step took (see RolloutDriver.state)

    def _restore(self, snapshot: dict) -> None:
        pass

    def _run_steps(self, start: int, logger, gpus) -> None:
        # the fleet starts from the weights training resumes from, as version `start`
        weights = self._weights()
        if self.world.is_main:
            self.weights_out.push(weights)
            saved = (self.resumed_state or {}).get("async")
            if saved is not None:   # said on every resume: 0 when the stop came before the next groups were drawn
                print(f"dockyard: async: {len(saved.get('replay') or [])} prompt group(s) drawn but not trained "
                      "before the stop are started again first", file=sys.stderr, flush=True)
            saved = saved or {}
            self.driver = RolloutDriver(self.cfg, self.fleet, self.collector, self.loaders[0], self.weights_out.push,
                                        version=start, replay=saved.get("replay"), seed=self.cfg.policy.seed).start()
        del weights
        self.published = start
        try:
            super()._run_steps(start, logger, gpus)
        except RunStopped:
            if self.driver is not None:
                self.driver.close(wait=False)   # saved: the requeue goes first, the process ends soon
            raise
        except BaseException:
            if self.driver is not None:
                self.driver.close()
            raise
        if self.driver is not None:
            self.driver.close()
