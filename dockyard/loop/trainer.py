"""What every training loop shares: the trainer ranks' world, the policy, the prompts and the
generation fleet, checkpoints with exact resume, stops at a safe point, and the step runner.

A loop (grpo.py, sft.py, async_grpo.py, distillation.py) extends Trainer with its `train_step` (and
what it needs for it); the runner calls it once a step:

    [stop?] -> train_step -> [validate] -> [checkpoint] -> log

Inside a step, `safe_point()` is where a stop agreed by every rank drops the step before anything
trained; the runner then restores the state of the previous step, saves it and raises RunStopped.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from dockyard import registry
from dockyard.config.schema import MasterConfig
from dockyard.data.datasets import DatasetError, Prompt, PromptLoader, load_prompts
from dockyard.distributed import WorldInfo, backend_for
from dockyard.generation.fleet import GeneratorFleet
from dockyard.generation.generator import GenerationServerError
from dockyard.generation.health import wait_until_healthy
from dockyard.generation.weight_transfer import FleetRefit, log_stderr
from dockyard.io.checkpoint import CheckpointManager, rng_state, set_rng_state
from dockyard.loop import stopping
from dockyard.loop.prompt_codec import PromptCodec
from dockyard.loop.stopping import RunStopped
from dockyard.models import DTYPES
from dockyard.policy.samples import TrainingInterrupted


class PhaseTimer:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _without(prompts: list[Prompt], held_out: set[str], name: str) -> list[Prompt]:
    kept = [p for p in prompts if str(p.input) not in held_out]
    if not kept:
        raise DatasetError(f"dataset {name!r}: every row is also a validation prompt")
    return kept


def serving_precision(cfg: MasterConfig) -> str:
    """vLLM serves in vllm_cfg.precision (fp8 is quantised from bf16 on load); the others in policy.precision."""
    if cfg.policy.generation.backend == "vllm":
        precision = cfg.policy.generation.vllm_cfg.precision
        return "bf16" if precision == "fp8" else precision
    return cfg.policy.precision


class StepAbandoned(Exception):
    """A stop was agreed before this step trained anything; the step is dropped, not saved."""

    def __init__(self, code: int):
        super().__init__(stopping.DESCRIPTION[code])
        self.code = code


class Trainer:
    long_prompts_skipped = 0

    def __init__(self, cfg: MasterConfig, world: WorldInfo, device: torch.device, replicas: list[dict],
                 weight_sync_port: int):
        self.cfg, self.world, self.device = cfg, world, device
        grpo = cfg.grpo
        self.group_size = grpo.num_generations_per_prompt
        self.mini_batch = cfg.policy.train_global_batch_size
        self.num_mini_batches = grpo.num_prompts_per_step * self.group_size // self.mini_batch
        self.max_steps, self.val_period = self.schedule()
        self.policy = registry.build("policy_backend", cfg.policy.backend, config=cfg, world=world, device=device,
                                     total_optimizer_steps=self.total_optimizer_steps())
        self.checkpoints = CheckpointManager(cfg.checkpointing, world.rank, hf_source=cfg.policy.model_name)
        self.timer = PhaseTimer()
        if world.is_main:
            self.env = registry.build("environment", cfg.env.name, config=cfg.env)
            self.codec = PromptCodec(cfg, self.env)
            self.tokenizer, self.chat_template = self.codec.tokenizer, self.codec.chat_template
            self.prompt_limit = self.longest_prompt()
            accept = self._prompt_fits if self.prompt_limit is not None else None
            # an environment may turn its rows into prompts (lettered choices, its response format)
            prepare = getattr(self.env, "prepare_prompts", lambda prompts: prompts)
            self.validation = prepare(load_prompts(cfg.data.validation)) if cfg.data.validation else []
            if accept is not None:
                self.validation = self._fitting(self.validation, "data.validation")
            if grpo.max_val_samples:
                self.validation = self.validation[:grpo.max_val_samples]
            # Training rows identical to a validation prompt are dropped, so validation stays held out.
            held_out = {str(p.input) for p in self.validation}
            self.loaders = [PromptLoader(_without(prepare(load_prompts(d)), held_out, d.name), d.shuffle, cfg.policy.seed,
                                         accept=accept, name=d.name)
                            for d in cfg.data.datasets]
            self.collector = self.codec.collector(self.loaders, self._generate, self.timer)
            self.fleet, self.weights_out = self._generation(replicas, weight_sync_port)
        self.engine_is_current = False
        self.engine_seconds = 0.0
        self.resumed_state: dict = {}
        self.stopper: stopping.StopRequests = stopping.NoStops()   # the entry point sets the real one
        self.generating = False

    def schedule(self) -> tuple[int, int]:
        """Steps of the run and the validation period (grpo.max_num_steps, grpo.val_period)."""
        return self.cfg.grpo.max_num_steps, self.cfg.grpo.val_period

    def total_optimizer_steps(self) -> int:
        """What the learning-rate schedule spans."""
        return self.max_steps * self.num_mini_batches * self.cfg.loss_fn.ppo_epochs

    # --- helpers ------------------------------------------------------------------------------

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        return self.codec.prompt_ids(prompt)

    def longest_prompt(self) -> int | None:
        """Prompts longer than this many tokens are skipped: data.max_input_seq_length, else the longest
        that leaves one token to generate within policy.max_total_sequence_length (None: keep every one)."""
        room = self.cfg.policy.max_total_sequence_length - 1
        limit = self.cfg.data.max_input_seq_length
        return room if limit is None else min(limit, room)

    def _prompt_fits(self, prompt: Prompt) -> bool:
        length = len(self._prompt_ids(prompt))
        if length <= self.prompt_limit:
            return True
        self.long_prompts_skipped += 1
        if self.long_prompts_skipped <= 3:
            print(f"dockyard: skipping a prompt of {length} tokens from dataset {prompt.source!r} (longer than "
                  f"{self.prompt_limit}: data.max_input_seq_length / policy.max_total_sequence_length)",
                  file=sys.stderr, flush=True)
        return False

    def _fitting(self, prompts: list[Prompt], where: str) -> list[Prompt]:
        kept = [p for p in prompts if self._prompt_fits(p)]
        if prompts and not kept:
            raise DatasetError(f"{where}: no prompt is short enough to generate from "
                               f"({self.prompt_limit} tokens: data.max_input_seq_length, "
                               "policy.max_total_sequence_length)")
        return kept

    def _generation(self, replicas: list[dict], weight_sync_port: int) -> tuple[GeneratorFleet, FleetRefit]:
        """The run's generation fleet and the path the trainer's weights take to it."""
        fleet = self._fleet(replicas)
        return fleet, FleetRefit(
            fleet.replicas, [urlparse(r["url"]).hostname or "" for r in replicas],
            self.cfg.policy.generation.weight_transfer,
            # the address the servers reach trainer rank 0 at (its node name under Slurm)
            os.environ.get("DOCKYARD_WEIGHT_SYNC_ADDR", "127.0.0.1"), weight_sync_port,
            backend=backend_for(self.device), log=log_stderr)

    def _fleet(self, replicas: list[dict]) -> GeneratorFleet:
        """Clients of the run's generation replicas ({name, url, log} each), of the configured backend."""
        if not replicas:
            raise GenerationServerError("no generation server was given to the trainer (DOCKYARD_REPLICAS)")
        server = registry.build("generation_backend", self.cfg.policy.generation.backend, config=self.cfg)
        timeout = self.cfg.grpo.sampler.rollout_timeout_s
        return GeneratorFleet([server.client(r["url"], r["name"], r.get("log"), request_timeout_s=timeout)
                               for r in replicas])

    def server_clients(self) -> list:
        """Rank 0's client of every server it talks to."""
        return list(self.fleet.replicas)

    def _broadcast(self, payload):
        if self.world.world_size == 1:
            return payload
        box = [payload]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # --- the loop's own parts ---------------------------------------------------------------

    def train_step(self, step: int) -> dict[str, float]:
        """One step of the loop, its metrics; it passes safe_point() before anything trains."""
        raise NotImplementedError

    def finished(self, step: int) -> bool:
        """True when the run ends after `step`, before max_steps (its data is used up)."""
        raise NotImplementedError

    # --- generation and validation ------------------------------------------------------------

    def refit(self) -> None:
        """Push the current weights to the engine (every rank takes part in gathering them)."""
        if self.engine_is_current:
            return
        # Cast to the precision the servers serve in (the same rounding they would do): bf16 halves
        # what crosses the wire.
        weights = self.policy.serving_weights(DTYPES[serving_precision(self.cfg)])
        if self.world.is_main:
            try:
                self.weights_out.push(weights)
            except (RuntimeError, GenerationServerError):
                # Slurm stops the servers together with the job (SIGTERM to every step): the stop's safe
                # point comes next and saves; nothing is generated with these weights any more
                if self.stopper.requested:
                    return
                raise
        self.engine_is_current = True

    def serve_latest_weights(self) -> None:
        """Before validation: the engine serves the weights just trained."""
        self.refit()

    def _generate(self, prompt_ids: list[list[int]], params, images=None):
        completions = self.fleet.generate(prompt_ids, params, images)
        self.engine_seconds += float(self.fleet.last_usage.get("generation_seconds", 0.0))
        return completions

    def abort_generation(self) -> None:
        """Called from a signal's helper thread: in-flight rollouts return now (the step is then dropped).
        Repeated while generating: an abort that reaches the engine just before the request does is
        cleared when the request starts."""
        try:
            while self.generating:
                self.fleet.abort()
                time.sleep(0.5)
        except GenerationServerError:
            pass

    def validate(self, step: int) -> dict[str, float]:
        """Accuracy on the validation split at policy.generation.eval_temperature (null: the sampling
        temperature; the shipped configs set 0, greedy), engine weights refreshed first; every answer is
        written to <log_dir>/validation/step_<N>.jsonl."""
        self.serve_latest_weights()
        if not self.world.is_main:
            return {}
        self.generating = True
        generation = self.cfg.policy.generation
        temperature = generation.temperature if generation.eval_temperature is None else generation.eval_temperature
        try:
            results = self.collector.evaluate(self.validation, temperature)
        except GenerationServerError:
            if self.stopper.requested:
                return {}
            raise
        finally:
            self.generating = False
        if self.stopper.requested:
            return {}   # aborted for a stop: partial answers are no accuracy figure
        rewards = [reward for _, reward in results]
        self._write_validation_answers(step, results)
        figures = {"val/accuracy": sum(r >= 1.0 for r in rewards) / len(rewards), "val/reward": sum(rewards) / len(rewards)}
        # rows that name their family (generated task sets: task.family) get an accuracy per family too
        families: dict[str, list[float]] = {}
        for prompt, reward in zip(self.validation, rewards):
            if isinstance(prompt.metadata.get("family"), str):
                families.setdefault(prompt.metadata["family"], []).append(reward)
        for family, values in sorted(families.items()):
            figures[f"val/accuracy/{family}"] = sum(r >= 1.0 for r in values) / len(values)
        return figures | self.collector.evaluation_figures

    def _write_validation_answers(self, step: int, results: list[tuple[str, float]]) -> None:
        folder = Path(self.cfg.logger.log_dir) / "validation"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"step_{step}.jsonl", "w", encoding="utf-8") as out:
            for prompt, (answer, reward) in zip(self.validation, results):
                out.write(json.dumps({"prompt": prompt.input, "label": prompt.label, "response": answer,
                                      "reward": reward}, default=str) + "\n")

    # --- stops ------------------------------------------------------------------------------

    def safe_point(self, batch_missing: bool = False) -> None:
        """Every rank holds the step's batch and nothing is trained yet: a stop agreed here drops the
        step (StepAbandoned), as does a batch rank 0 could not collect because a stop came first."""
        code = self.stopper.agree()
        if code or batch_missing:
            raise StepAbandoned(code or stopping.TERM)

    def train_interrupt(self):
        """The policy asks this between micro-batches until the step's first optimizer step: a stop
        agreed then still drops the whole step (the wait for a safe point stays one micro-batch long)."""
        return (lambda: bool(self.stopper.agree())) if self.stopper.can_stop else None

    def train_mini_batch(self, *args, **kwargs) -> dict[str, float]:
        """The policy's optimizer step on a mini-batch; StepAbandoned when a stop interrupted it."""
        try:
            return self.policy.train_mini_batch(*args, **kwargs)
        except TrainingInterrupted:
            raise StepAbandoned(self.stopper.last) from None

    # --- run ----------------------------------------------------------------------------------

    def _trainer_state(self, metrics: dict[str, float]) -> dict:
        return {"loaders": [loader.state_dict() for loader in self.loaders] if self.world.is_main else None,
                "metrics": metrics}

    def resume(self) -> int:
        path = self.checkpoints.latest()
        if path is None:
            return 0
        state = self.checkpoints.load(path, self.policy.checkpoint_state())
        self.resumed_state = state
        if self.world.is_main:
            for loader, loader_state in zip(self.loaders, state["loaders"]):
                loader.load_state_dict(loader_state)
            print(f"resumed from {path} (step {state['step']})", file=sys.stderr, flush=True)
            for what in state["not_restored"]:
                print(f"dockyard: resumed without {what}", file=sys.stderr, flush=True)
        return int(state["step"])

    def _snapshot(self) -> dict:
        return {"loaders": copy.deepcopy([loader.state_dict() for loader in self.loaders]) if self.world.is_main
                else None, "rng": rng_state()}

    def _restore(self, snapshot: dict) -> None:
        if self.world.is_main:
            for loader, state in zip(self.loaders, snapshot["loaders"]):
                loader.load_state_dict(state)
        set_rng_state(snapshot["rng"])

    def _save(self, step: int, metrics: dict[str, float]) -> None:
        started = time.perf_counter()
        with self.timer("checkpoint"):
            self.checkpoints.save(step, self.policy.checkpoint_state(),
                                  self._trainer_state({k: v for k, v in metrics.items() if isinstance(v, float)}))
        self.stopper.note_save(time.perf_counter() - started)

    def _stop(self, code: int, step: int, metrics: dict[str, float]) -> None:
        """Save the state after `step` (unless that checkpoint exists) and raise RunStopped."""
        ckpt = self.cfg.checkpointing
        if not ckpt.enabled:
            print("dockyard: checkpointing is disabled; stopping without saving", file=sys.stderr, flush=True)
        elif step > 0 and self.checkpoints.latest_step() != step:
            started = time.perf_counter()
            self._save(step, metrics)
            if self.world.is_main:
                print(f"dockyard: saved step {step} in {time.perf_counter() - started:.2f} s "
                      f"({stopping.DESCRIPTION[code]})", file=sys.stderr, flush=True)
        raise RunStopped(code, step)

    def run(self) -> None:
        from dockyard.io.metrics import MetricsLogger

        cfg = self.cfg
        start = self.resume()
        machine = None
        if self.world.is_main:
            from dockyard.machine import machine_summary

            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
                if cfg.cluster.gpus_per_node > 0 and torch.cuda.is_available() else None
            machine = machine_summary(gpus=gpus)
            print(f"dockyard: machine: {machine}", file=sys.stderr, flush=True)
        logger = MetricsLogger(cfg.logger, self.max_steps, start, run_name=cfg.name or "dockyard",
                               run_config=cfg.model_dump(mode="json"), machine=machine) if self.world.is_main else None
        gpus = None
        if logger and cfg.cluster.gpus_per_node > 0 and cfg.logger.monitor_gpus:
            from dockyard.io.gpu_monitor import GpuMonitor

            gpus = GpuMonitor()
            if not gpus.available:
                print(f"dockyard: no GPU figures in the metrics: {gpus.reason}", file=sys.stderr, flush=True)
        if self.world.is_main:   # `dockyard run` starts the servers beside the ranks
            wait_until_healthy(self.server_clients(), float(os.environ.get("DOCKYARD_SERVER_START_TIMEOUT_S", 120)))
        try:
            self._run_steps(start, logger, gpus)
        finally:
            if logger:
                logger.close()
            close = getattr(getattr(self, "weights_out", None), "close", None)
            if close is not None:
                close()

    def _run_steps(self, start: int, logger, gpus) -> None:
        cfg = self.cfg
        if cfg.grpo.val_at_start and start == 0 and cfg.data.validation is not None:
            val = self.validate(0)
            if logger:
                logger.log(0, val, console=False)
        last_metrics: dict[str, float] = {}
        for step in range(start + 1, self.max_steps + 1):
            if code := self.stopper.agree():
                self._stop(code, step - 1, last_metrics)
            snapshot = self._snapshot() if self.stopper.can_stop else None
            step_started = time.perf_counter()
            try:
                metrics = self.train_step(step)
            except StepAbandoned as abandoned:
                # nothing of this step was trained: back to the state after the previous step
                self._restore(snapshot)
                self._stop(abandoned.code, step - 1, last_metrics)
            if self.val_period and step % self.val_period == 0 and cfg.data.validation is not None:
                with self.timer("validate"):
                    metrics.update(self.validate(step))
                metrics["time/validate"] = self.timer.seconds["validate"]
            last = step == self.max_steps or self.finished(step)
            ckpt = cfg.checkpointing
            if ckpt.enabled and ((ckpt.save_period > 0 and step % ckpt.save_period == 0) or last):
                self._save(step, metrics)
                metrics["time/checkpoint"] = self.timer.seconds["checkpoint"]
            total = time.perf_counter() - step_started
            self.stopper.note_step(total)
            last_metrics = {k: v for k, v in metrics.items() if isinstance(v, float)}
            if logger:
                # Orchestration overhead: step time not spent computing (engine decoding, trainer
                # forward/backward, validation, checkpoint writes): HTTP, tokenising, scoring,
                # batch broadcast, weight transfer, bookkeeping.
                compute = metrics.get("gen/engine_seconds", 0.0) + sum(
                    metrics.get(f"time/{name}", 0.0) for name in ("logprobs", "train", "validate", "checkpoint"))
                metrics["time/step"] = total
                metrics["time/overhead"] = max(0.0, total - compute)
                metrics["time/overhead_fraction"] = metrics["time/overhead"] / total
                if gpus is not None:
                    metrics.update(gpus.sample())
                logger.log(step, metrics)
            if last:
                break
