"""Multi-turn rollouts (env.agent set): every trajectory of the step is an episode of the agent in
the environment, and the episodes advance turn by turn together, so each turn is one batched
generate call across them all (the engine batches; a replica fleet spreads them).

A turn, phase by phase:

    generate (every live episode's tokens so far) -> read replies as actions -> run the actions
    (in parallel, env.num_workers at a time) -> add each observation's tokens

Screenshots (an environment whose observations carry images, OSWorld's screenshot types): each passes
the multimodal gate when it is observed and is kept, as the PNG the servers are sent, beside the one
image placeholder token the agent wrote for it; every generate call sends each episode's images, and the
trained sample carries them (the trainer expands them as the server did: dockyard/vision.py). A reply
that samples the placeholder token itself fails the attempt: no image stands behind it.

An episode ends when the agent submits (or replies without an action), at grpo.max_rollout_turns,
when the next turn would not fit policy.max_total_sequence_length, or when its time (the task's
agent timeout, at most env.task_timeout_s) is up. Then the environment scores it. The trajectory
is the exact token stream (transcript.py): loss mask 1 on sampled tokens only. A sandbox or tool
failure makes the attempt FAILED (retried up to grpo.retry_limit, as single-turn scoring errors are).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from dockyard import registry
from dockyard.algorithms.group_filters import FAILED
from dockyard.agents.transcript import Transcript, TranscriptError
from dockyard.data.datasets import DatasetError, Prompt
from dockyard.generation.images import ImageGate, ImageRejected, as_png
from dockyard.loop.rollouts import Group, RolloutCollector, Trajectory
from dockyard.policy.samples import Sample


@dataclass
class Episode:
    prompt: Prompt
    group: int
    transcript: Transcript | None = None
    handle: object = None                 # the environment's episode
    done: bool = False
    ended_by: str = ""
    invalid_actions: int = 0
    finish_reason: str = "stop"
    reward: float = 0.0
    error: str | None = None
    turns: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class AgentRolloutCollector(RolloutCollector):
    def __init__(self, cfg, env, loaders, generate, sampling, decode, tokenizer, chat_template=None,
                 template_kwargs=None, timer=None):
        super().__init__(cfg, env, loaders, generate, prompt_ids=None, sampling=sampling, decode=decode, timer=timer)
        if not getattr(env, "multi_turn", False):
            raise ValueError(f"env.agent: environment {cfg.env.name!r} is single-turn; set env.agent to null")
        settings = dict(getattr(env, "agent_settings", {}))
        self.image_gate = ImageGate.from_generation(cfg.policy.generation)
        self.image_token_id = self.vision = None
        if settings.get("observation_type", "a11y_tree") != "a11y_tree" and self.image_gate.allowed:
            from dockyard.vision import VisionInputs

            self.vision = VisionInputs(cfg.policy.model_name)   # a screenshot's tokens count against the budget
            settings["image_token"], settings["image_placeholder"] = self.vision.image_token, self.vision.placeholder
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.vision.image_token)
        self.agent = registry.build("agent", cfg.env.agent, tokenizer=tokenizer, tools=env.tools,
                                    system_prompt=cfg.data.add_system_prompt, chat_template=chat_template,
                                    template_kwargs=template_kwargs, tool_format=getattr(env, "tool_format", "auto"),
                                    **settings)
        self.max_turns = cfg.grpo.max_rollout_turns
        self.max_total = cfg.policy.max_total_sequence_length
        self.workers = cfg.env.num_workers
        self.dump = Path(cfg.env.dump_trajectory_path) if cfg.env.dump_trajectory_path else None
        self._dump_lock = threading.Lock()
        self.step = 0

    # --- one batch of episodes ----------------------------------------------------------------

    def _open(self, episode: Episode) -> None:
        try:
            episode.handle = self.env.open(episode.prompt)
        except Exception as err:
            episode.done, episode.error, episode.ended_by = True, f"{type(err).__name__}: {err}", "error"
        # an environment whose agent sees it before acting (a desktop) gives its first observation
        seen = getattr(episode.handle, "first_observation", None)
        episode.transcript = Transcript(self.agent.first_prompt(episode.prompt, *([seen] if seen is not None else [])))
        if not episode.done:
            try:
                images, growth = self._images(seen, episode.transcript.prompt_ids)
                episode.transcript.images, episode.transcript.image_growth = images, growth
            except (ImageRejected, TranscriptError) as err:
                episode.done, episode.error, episode.ended_by = True, f"{type(err).__name__}: {err}", "error"
        if episode.transcript.length >= self.max_total and not episode.done:
            if seen is not None:   # this attempt's observation was too long: another may fit
                episode.done, episode.ended_by = True, "error"
                episode.error = (f"the first prompt with the environment's first observation is "
                                 f"{episode.transcript.length} tokens, no room within "
                                 f"policy.max_total_sequence_length ({self.max_total})")
                return
            # the config's budget, not this attempt's bad luck: no retry can fix it
            episode.handle.close()
            raise DatasetError(f"a first prompt of {len(episode.transcript.prompt_ids)} tokens (system message, tool "
                               f"format and instruction) leaves no room within policy.max_total_sequence_length "
                               f"({self.max_total})")

    def _act(self, episode: Episode, reply: str, reply_ended: bool, versions: list[int] | None = None) -> None:
        """Read the reply; run its action; add the observation's tokens (or end the episode)."""
        action = self.agent.act(reply)
        turn = {"reply": reply, "action": action.kind}
        if versions:   # async: the weights version(s) that sampled this turn
            turn["weights_versions"] = sorted(set(versions))
        episode.turns.append(turn)
        if action.kind == "submit":
            episode.done, episode.ended_by = True, "submit"
            note = getattr(episode.handle, "submitted", None)
            if note is not None:   # how the agent ended matters to some tasks (OSWorld's FAIL)
                note(action)
            return
        if action.kind == "invalid":
            episode.invalid_actions += 1
            observation = self.agent.invalid_observation(action)
            turn["error"] = action.error
        else:
            turn["tool"], turn["arguments"] = action.name, action.arguments
            try:
                observation = episode.handle.execute(action)
            except Exception as err:   # the sandbox or the tool broke: this attempt FAILS
                episode.done, episode.error, episode.ended_by = True, f"{type(err).__name__}: {err}", "error"
                return
            turn["observation"] = observation
        if episode.transcript.turns >= self.max_turns:
            episode.done, episode.ended_by = True, "max_rollout_turns"
            return
        if episode.handle.out_of_time:
            episode.done, episode.ended_by = True, "task_timeout"
            return
        previous = episode.transcript.ids
        added = self.agent.observation_ids(observation, reply_ended)
        try:
            images, growth = self._images(observation, added)
        except (ImageRejected, TranscriptError) as err:
            episode.done, episode.error, episode.ended_by = True, f"{type(err).__name__}: {err}", "error"
            return
        if episode.transcript.length + len(added) + growth >= self.max_total:
            episode.done, episode.ended_by = True, "max_total_sequence_length"
            return
        episode.transcript.extend(previous, added)
        episode.transcript.images += images
        episode.transcript.image_growth += growth

    def _images(self, observation, ids: list[int]) -> tuple[list[bytes], int]:
        """The observation's screenshot through the gate, as the PNG the servers are sent, and how many
        tokens its placeholder grows by once expanded; `ids` must hold exactly one placeholder for it."""
        screenshot = getattr(observation, "screenshot", None)
        if self.vision is None:
            if screenshot is not None:
                raise ImageRejected("the environment sent a screenshot but policy.generation.allow_multimodal_inputs "
                                    "is false")
            return [], 0
        images = [] if screenshot is None else [as_png(self.image_gate.normalise(screenshot, "the screenshot"))]
        placed = ids.count(self.image_token_id)
        if placed != len(images):
            raise TranscriptError(f"an observation with {len(images)} screenshot(s) was tokenised with {placed} image "
                                  "placeholder(s): the chat template must render a message's text as it is "
                                  "(policy.generation.chat_template.path)")
        return images, sum(len(self.vision.expansion(image)[0]) - 1 for image in images)

    def _finish(self, episode: Episode) -> None:
        try:
            if episode.error is None and episode.handle is not None:
                episode.reward = float(episode.handle.finish())
                refused = getattr(episode.handle, "verifier_error", None)
                if refused:
                    print(f"dockyard: verifier error ({episode.prompt.metadata.get('name') or episode.prompt.source}): "
                          f"{refused}; reward 0", file=sys.stderr, flush=True)
        except Exception as err:
            episode.error = f"{type(err).__name__}: {err}"
        finally:
            if episode.handle is not None:
                try:
                    episode.handle.close()
                except Exception as err:   # a sandbox that will not go away is logged, never fatal
                    print(f"dockyard: closing an episode's sandbox failed: {err}", file=sys.stderr, flush=True)

    def run_episodes(self, prompts: list[Prompt], n: int, seed: int, temperature: float | None = None) -> list[Episode]:
        """n episodes per prompt, to the end; Episode.group is the prompt's index."""
        episodes = [Episode(p, g) for g, p in enumerate(prompts) for _ in range(n)]
        # in waves no larger than the environment can hold open at once (env.sandbox.max_concurrent):
        # a lockstep batch waiting for a sandbox slot that only its own episodes could free would hang
        wave = getattr(self.env, "capacity", None) or len(episodes)
        try:
            for start in range(0, len(episodes), wave):
                self._run(episodes[start:start + wave], seed + 15_485_863 * (start // wave), temperature)
            return episodes
        except BaseException:
            for episode in episodes:   # an interrupted batch leaves no sandbox behind (close is idempotent)
                if episode.handle is not None:
                    try:
                        episode.handle.close()
                    except Exception:
                        pass
            raise

    def _run(self, episodes: list[Episode], seed: int, temperature: float | None) -> list[Episode]:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(self._open, episodes))
            turn = 0
            while True:
                live = [e for e in episodes if not e.done]
                if not live:
                    break
                # one generate call per token budget (usually one: the per-turn budget)
                budgets: dict[int, list[Episode]] = {}
                for episode in live:
                    room = self.max_total - episode.transcript.length
                    params = self.sampling([episode.transcript.length], 1, seed + 7_919 * turn, temperature)
                    budgets.setdefault(min(room, params.max_tokens), []).append(episode)
                replies: list[tuple[Episode, str, bool, list[int] | None]] = []
                with self.timer("generate"):
                    for budget, batch in budgets.items():
                        params = replace(self.sampling([e.transcript.length for e in batch], 1, seed + 7_919 * turn,
                                                       temperature), max_tokens=budget)
                        images = [e.transcript.images for e in batch]
                        completions = self.generate([e.transcript.ids for e in batch], params,
                                                    *([images] if any(images) else []))
                        for completion in completions:
                            episode = batch[completion.prompt_index]
                            episode.transcript.add_sampled(completion.token_ids, completion.logprobs,
                                                           completion.versions)
                            if self.image_token_id is not None and self.image_token_id in completion.token_ids:
                                episode.done, episode.ended_by = True, "error"
                                episode.error = ("the reply sampled the image placeholder token, which no image "
                                                 "stands behind; the attempt is dropped")
                                continue
                            episode.finish_reason = completion.finish_reason
                            ended = bool(completion.token_ids) and completion.token_ids[-1:] == self.agent.bridge.end_ids[-1:]
                            replies.append((episode, self.decode(completion.token_ids), ended, completion.versions))
                with self.timer("environment"):
                    list(pool.map(lambda r: self._act(*r), replies))
                turn += 1
            with self.timer("reward"):
                list(pool.map(self._finish, episodes))
        return episodes

    def _trajectory(self, episode: Episode, attempt: int) -> Trajectory:
        transcript = episode.transcript
        if transcript is None:
            transcript = Transcript([0])
        sample = Sample(token_ids=transcript.ids, prompt_length=len(transcript.prompt_ids),
                        loss_mask=list(transcript.mask), rollout_logprobs=list(transcript.logprobs),
                        images=list(transcript.images) or None)
        trajectory = Trajectory(sample, episode.reward, finish_reason=episode.finish_reason,
                                max_tokens=self.max_total - len(transcript.prompt_ids), attempts=attempt,
                                action_valid=episode.invalid_actions == 0, versions=list(transcript.versions),
                                suspicious=list(getattr(episode.handle, "suspicious", None) or []),
                                verifier_error=getattr(episode.handle, "verifier_error", None))
        if episode.error is not None or not transcript.tokens:
            trajectory.status, trajectory.error = FAILED, episode.error or "no tokens were generated"
            trajectory.raw_reward = 0.0
        return trajectory

    def sample_groups(self, prompts: list[Prompt], seed: int) -> list[Group]:
        episodes = self.run_episodes(prompts, self.group_size, seed)
        groups = [Group(p) for p in prompts]
        slots = []
        for episode in episodes:
            groups[episode.group].trajectories.append(self._trajectory(episode, 1))
            slots.append((episode.group, len(groups[episode.group].trajectories) - 1))
        self._dump_episodes(episodes, seed)
        for attempt in range(2, self.cfg.grpo.retry_limit + 1):
            failed = [(g, k) for g, group in enumerate(groups) for k, t in enumerate(group.trajectories)
                      if t.status == FAILED]
            if not failed:
                break
            again = self.run_episodes([prompts[g] for g, _ in failed], 1, seed + 104_729 * attempt)
            self._dump_episodes(again, seed)
            for (g, k), episode in zip(failed, again):
                groups[g].trajectories[k] = self._trajectory(episode, attempt)
        failed = [t for group in groups for t in group.trajectories if t.status == FAILED]
        if failed:
            print(f"dockyard: {len(failed)} episode(s) FAILED after {self.cfg.grpo.retry_limit} attempt(s) "
                  f"(grpo.retry_limit); first error: {failed[0].error}", file=sys.stderr, flush=True)
        self._transform(groups)
        return groups

    def evaluate(self, prompts: list[Prompt], temperature: float) -> list[tuple[str, float]]:
        """One episode per prompt at `temperature`: (the agent's replies, reward) each."""
        episodes = self.run_episodes(prompts, 1, 0, temperature)
        self._dump_episodes(episodes, 0, validation=True)
        count = max(len(episodes), 1)
        self.evaluation_figures = {
            "val/turns_mean": sum(len(e.turns) for e in episodes) / count,
            "val/invalid_actions_mean": sum(e.invalid_actions for e in episodes) / count,
            "val/timeout_fraction": sum(e.ended_by == "task_timeout" for e in episodes) / count,
            "val/out_of_turns_fraction": sum(e.ended_by == "max_rollout_turns" for e in episodes) / count,
            "val/error_fraction": sum(e.error is not None for e in episodes) / count}
        return [("\n".join(t["reply"] for t in e.turns), 0.0 if e.error else e.reward) for e in episodes]

    def _dump_episodes(self, episodes: list[Episode], seed: int, validation: bool = False) -> None:
        if self.dump is None:
            return
        self.dump.mkdir(parents=True, exist_ok=True)
        name = "validation" if validation else "train"
        with self._dump_lock, open(self.dump / f"{name}_step_{self.step}.jsonl", "a", encoding="utf-8") as out:
            for episode in episodes:
                events = getattr(episode.handle, "events", [])
                out.write(json.dumps({
                    "prompt": episode.prompt.input, "task": episode.prompt.metadata, "seed": seed,
                    "turns": episode.turns, "sandbox_events": events, "ended_by": episode.ended_by,
                    "suspicious_files": getattr(episode.handle, "suspicious", []),
                    "verifier_error": getattr(episode.handle, "verifier_error", None),
                    "invalid_actions": episode.invalid_actions, "reward": episode.reward, "error": episode.error,
                    "screenshots": len(episode.transcript.images) if episode.transcript else 0,
                    "seconds": round(time.monotonic() - episode.started, 3)}, default=str) + "\n")
