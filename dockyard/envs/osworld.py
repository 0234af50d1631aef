"""`osworld`: computer-use tasks in OSWorld's format on a desktop in a sandbox (env.agent: computer_use).

A dataset row is a task: its instruction (the prompt) and, under the metadata key, `path`: the task's
JSON file (osworld_tasks.py), relative to the dataset file; `dockyard env index DIR` writes such rows.

An episode: a sandbox whose working directory is OSWorld's home, /home/user; a desktop in it
(desktop/session.py: Xvfb, openbox, the session and accessibility buses, the task's applications); the
task's `config` steps; then turns of observation (the accessibility tree, linearised, and / or a screenshot) and the agent's
actions, each followed by `sleep_after_action_s`; at the end the task's evaluator on the live desktop
(osworld_evaluation.py), and the sandbox is destroyed. A desktop that does not come up, dies, or stops
answering fails the attempt (retried as other environments' failures are); a verifier error (a getter
or metric that breaks) scores 0 and is reported.

Extra env keys (checked before anything starts):
  action_space          pyautogui (default) | computer_13 (desktop/actions.py)
  observation_type      a11y_tree (default), screenshot or screenshot_a11y_tree. A screenshot reaches the
                        model through the multimodal gate as an image placeholder: it needs a vision-language
                        policy and policy.generation.allow_multimodal_inputs (checked at submit).
  screen                {width, height}: the desktop's size (1920x1080, OSWorld's)
  max_observation_chars how much of the linearised tree the model sees per turn (6000)
  sleep_after_action_s  how long the desktop gets to react to an action before it is observed (0.5)
  a11y_max_nodes        nodes read from the accessibility tree per observation (3000)
  files_dir             where `download` and `cloud_file` URLs find their local copies, by file name (null)
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dockyard.agents.tool_format import Action
from dockyard.config.schema.env import EnvConfig, SandboxConfig
from dockyard.data.datasets import Prompt, row_path
from dockyard.desktop.actions import ActionError, Screen, parse_pyautogui
from dockyard.desktop.observation import DesktopObservation, linearize
from dockyard.desktop.session import DesktopError, DesktopSession, missing_programs
from dockyard.envs.osworld_evaluation import EvaluationError, evaluate, run_steps
from dockyard.envs.osworld_tasks import OSWorldTask, OSWorldTaskError, launched_programs, load_task, load_tasks
from dockyard.envs.terminal_trial import TrialResult
from dockyard.sandboxes.base import SandboxSpec
from dockyard.sandboxes.factory import SandboxFactory

HOME = "/home/user"   # OSWorld's tasks name their files under the VM user's home
ACTION_SPACES = ("pyautogui", "computer_13")
OBSERVATION_TYPES = ("a11y_tree", "screenshot", "screenshot_a11y_tree")
DESKTOP_SANDBOXES = ("bubblewrap", "podman", "apptainer", "enroot")


@dataclass(frozen=True)
class OSWorldSettings:
    action_space: str = "pyautogui"
    observation_type: str = "a11y_tree"
    width: int = 1920   # OSWorld's screen: its tasks' set-up scripts click at 1920x1080 coordinates
    height: int = 1080
    max_observation_chars: int = 6000
    sleep_after_action_s: float = 0.5
    a11y_max_nodes: int = 3000
    files_dir: Path | None = None


def _positive(value, key: str, kind=int):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)) \
            or value <= 0:
        raise ValueError(f"env.{key}: must be a positive {'whole ' if kind is int else ''}number, got {value!r}")
    return kind(value)


class OSWorldEnvironment:
    """OSWorld tasks for the computer_use agent."""

    multi_turn = True
    task_images = False
    agents = ("computer_use",)
    tools: list = []
    EXTRA_KEYS = {"action_space", "observation_type", "screen", "max_observation_chars", "sleep_after_action_s",
                  "a11y_max_nodes", "files_dir"}

    @classmethod
    def check_settings(cls, config: EnvConfig) -> OSWorldSettings:
        """The env settings, checked (ValueError naming the field); the preflight calls it too."""
        extra = dict(config.model_extra or {})
        unknown = sorted(set(extra) - cls.EXTRA_KEYS)
        if unknown:
            raise ValueError(f"env.{unknown[0]}: not an osworld setting (known: {', '.join(sorted(cls.EXTRA_KEYS))})")
        space = extra.get("action_space", "pyautogui")
        if space not in ACTION_SPACES:
            raise ValueError(f"env.action_space: {space!r} is not one of {', '.join(ACTION_SPACES)}")
        observation = extra.get("observation_type", "a11y_tree")
        if observation not in OBSERVATION_TYPES:
            raise ValueError(f"env.observation_type: {observation!r} is not one of {', '.join(OBSERVATION_TYPES)}")
        screen = extra.get("screen", {"width": 1920, "height": 1080})
        if not isinstance(screen, dict) or set(screen) != {"width", "height"}:
            raise ValueError(f"env.screen: must be {{width, height}}, got {screen!r}")
        width, height = _positive(screen["width"], "screen.width"), _positive(screen["height"], "screen.height")
        if width > 7680 or height > 4320:
            raise ValueError(f"env.screen: {width}x{height} is larger than the 7680x4320 this desktop serves")
        files_dir = extra.get("files_dir")
        if files_dir is not None and not isinstance(files_dir, str):
            raise ValueError(f"env.files_dir: must be a folder path, got {files_dir!r}")
        sandbox = config.sandbox or SandboxConfig()
        if sandbox.type not in DESKTOP_SANDBOXES:
            raise ValueError(f"env.sandbox.type: {sandbox.type} cannot hold a desktop (the agent's desktop must run "
                             f"isolated); use {' or '.join(DESKTOP_SANDBOXES)}")
        if sandbox.image and sandbox.agent_user != "sandbox":
            raise ValueError(f"env.sandbox.agent_user: {sandbox.agent_user} would make the agent root inside the "
                             "image, which needs a built task image; a desktop image runs its agent as the "
                             "sandbox's user: set env.sandbox.agent_user=sandbox")
        if sandbox.type in ("bubblewrap", "podman") and not sandbox.image:
            missing = missing_programs()
            if missing:
                raise ValueError(f"env.sandbox.type: the desktop runs on this machine's /usr, which lacks "
                                 f"{', '.join(missing)} (`apt-get install {' '.join(missing)}`; tools/install.sh "
                                 "installs the desktop)")
        return OSWorldSettings(
            action_space=space, observation_type=observation, width=width, height=height,
            max_observation_chars=_positive(extra.get("max_observation_chars", 6000), "max_observation_chars"),
            sleep_after_action_s=_sleep_seconds(extra.get("sleep_after_action_s", 0.5)),
            a11y_max_nodes=_positive(extra.get("a11y_max_nodes", 3000), "a11y_max_nodes"),
            files_dir=Path(files_dir) if files_dir else None)

    def __init__(self, config: EnvConfig):
        self.config = config
        self.settings = self.check_settings(config)
        self.sandboxes = SandboxFactory(config.sandbox or SandboxConfig())
        self._tasks: dict[Path, OSWorldTask] = {}
        self._lock = threading.Lock()

    @property
    def agent_settings(self) -> dict:
        """What the computer_use agent needs to read and check actions."""
        return {"action_space": self.settings.action_space, "screen": (self.settings.width, self.settings.height),
                "observation_type": self.settings.observation_type}

    @property
    def capacity(self) -> int:
        return self.sandboxes.config.max_concurrent

    def task_for(self, prompt: Prompt) -> OSWorldTask:
        file = row_path(prompt)
        if file is None:
            raise OSWorldTaskError(f"dataset {prompt.source!r}: an osworld row needs its task file as `path` in its "
                                   "metadata (data.datasets[].metadata_key)")
        with self._lock:
            if file not in self._tasks:
                self._tasks[file] = self.usable(load_task(file, self.settings.files_dir))
            return self._tasks[file]

    def usable(self, task: OSWorldTask) -> OSWorldTask:
        """The task, or OSWorldTaskError naming an application it launches that the desktop lacks (where the
        desktop runs on this machine's /usr; an image's own programs are found when it runs)."""
        if self.sandboxes.config.image is None:
            for where, program in launched_programs(task):
                if shutil.which(program) is None:
                    raise OSWorldTaskError(f"{task.path}: {where} launches {program}, which the desktop does not "
                                           "have (containers/desktop.packages lists what it has)")
        return task

    def open(self, prompt: Prompt) -> "OSWorldEpisode":
        return OSWorldEpisode(self, self.task_for(prompt))

    @classmethod
    def reference_trials(cls, cfg, source: Path, agent: str) -> tuple[list[TrialResult], list[str]]:
        """`dockyard env check`: every task on a desktop with its scripted oracle (`<id>.oracle.py`) or the
        no-op agent; a task that cannot be read is reported and the others still run."""
        env = cls(cfg.env)
        problems: list[str] = []
        tasks = []
        for task in load_tasks(source, env.settings.files_dir, problems):
            try:
                tasks.append(env.usable(task))
            except OSWorldTaskError as err:
                problems.append(str(err))
        with ThreadPoolExecutor(max_workers=min(cfg.env.num_workers, env.capacity)) as pool:
            return list(pool.map(lambda task: env.trial(task, agent), tasks)), problems

    def trial(self, task: OSWorldTask, agent: str) -> TrialResult:
        started = time.monotonic()
        result = TrialResult(task.id, 0.0, 0.0)
        episode = None
        try:
            episode = OSWorldEpisode(self, task)
            if agent == "oracle":
                if task.oracle is None:
                    raise OSWorldTaskError(f"task {task.id}: no scripted oracle ({task.path.stem}.oracle.py beside "
                                           "the task file)")
                episode.run_oracle(task.oracle)
            result.reward = episode.finish()
            result.verifier_error = episode.verifier_error
            if episode.verifier_error:
                result.notes.append(f"verifier error: {episode.verifier_error}")
            result.tests_ran = "yes" if episode.verifier_error is None else "no"
        except Exception as err:
            result.error = f"{type(err).__name__}: {err}"
        finally:
            if episode is not None:
                result.test_output = "\n".join(str(event) for event in episode.events)[-8000:]
                episode.close()
        result.seconds = time.monotonic() - started
        return result


def _sleep_seconds(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 30:
        raise ValueError(f"env.sleep_after_action_s: must be a number of seconds from 0 to 30, got {value!r}")
    return float(value)


class OSWorldEpisode:
    """One task on one desktop: set up, observed and acted on turn by turn, then evaluated."""

    def __init__(self, env: OSWorldEnvironment, task: OSWorldTask):
        self.env, self.task, self.settings = env, task, env.settings
        self.events: list[dict] = []
        self.suspicious: list[str] = []
        self.verifier_error: str | None = None
        self.last_action: str | None = None
        sandbox_config = env.sandboxes.config
        self.sandbox = env.sandboxes.create(SandboxSpec(workdir=HOME, name=f"task {task.id}"))
        try:
            self.desktop = DesktopSession(self.sandbox, self.settings.width, self.settings.height,
                                          start_timeout_s=sandbox_config.creation_timeout_s,
                                          request_timeout_s=min(sandbox_config.command_exec_timeout_s, 120.0)).start()
            run_steps(self.desktop, task.config, task, self.events, sandbox_config.command_exec_timeout_s,
                      (self.settings.width, self.settings.height))
            self.first_observation = self.observe()
        except BaseException:
            self.close()
            raise
        self.deadline = time.monotonic() + env.config.task_timeout_s

    @property
    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline

    def observe(self) -> str | DesktopObservation:
        """The observation type's view of the desktop: the linearised tree (a11y_tree, as text), or a
        DesktopObservation with the screenshot (and the tree, for screenshot_a11y_tree)."""
        kind = self.settings.observation_type
        tree = None
        if kind != "screenshot":
            xml = self.desktop.a11y_tree(max_nodes=self.settings.a11y_max_nodes)["xml"]
            tree = linearize(xml, self.settings.width, self.settings.height, self.settings.max_observation_chars)
            if kind == "a11y_tree":
                return tree
        return DesktopObservation(tree=tree, screenshot=self.desktop.screenshot())

    def execute(self, action: Action) -> str | DesktopObservation:
        """Run the reply's checked actions on the desktop; the next observation."""
        actions = action.arguments.get("actions", [])
        try:
            if actions:
                self.desktop.act(actions)
                time.sleep(self.settings.sleep_after_action_s)
            self.last_action = action.arguments.get("special") or "actions"
            self.events.append({"actions": actions, "special": action.arguments.get("special")})
            return self.observe()
        except DesktopError as err:
            if not self.desktop.alive():
                raise   # the desktop is gone: this attempt fails
            # an action the desktop could not carry out (xdotool refused it): the agent is told and goes on
            self.events.append({"actions": actions, "error": str(err)})
            seen = self.observe()
            if isinstance(seen, DesktopObservation):
                return DesktopObservation(seen.tree, seen.screenshot, note=f"The action failed: {err}")
            return f"The action failed: {err}\n\n{seen}"

    def submitted(self, action: Action) -> None:
        """The agent ended the episode: DONE, or FAIL (it says the task cannot be done)."""
        self.last_action = action.arguments.get("special", "DONE")
        self.events.append({"special": self.last_action})

    def run_oracle(self, code: str) -> None:
        """A task's scripted oracle, through the agent's own parser: pyautogui code, or FAIL."""
        if code.strip() == "FAIL":
            self.last_action = "FAIL"
            return
        try:
            actions = parse_pyautogui(code, Screen(self.settings.width, self.settings.height))
        except ActionError as err:
            raise OSWorldTaskError(f"task {self.task.id}: its oracle: {err}") from None
        self.desktop.act(actions)
        time.sleep(self.settings.sleep_after_action_s)
        self.last_action = "DONE"

    def finish(self) -> float:
        """The task's evaluator on the desktop as the agent left it: the reward."""
        if not self.desktop.alive():
            raise DesktopError(f"task {self.task.id}: the desktop ended before it could be evaluated")
        with tempfile.TemporaryDirectory(prefix="dockyard-osworld-") as folder:
            try:
                reward = evaluate(self.desktop, self.task, self.last_action, Path(folder),
                                  (self.settings.width, self.settings.height), self.events,
                                  self.env.sandboxes.config.command_exec_timeout_s)
            except (EvaluationError, DesktopError) as err:
                self.verifier_error = str(err)
                reward = 0.0
        self.events.append({"reward": reward, "verifier_error": self.verifier_error})
        return reward

    def close(self) -> None:
        desktop = getattr(self, "desktop", None)
        try:
            if desktop is not None:
                desktop.close()
        finally:
            self.sandbox.destroy()
