"""`env`: the environment that steps and scores trajectories, its agent, reward and sandbox."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import PositiveInt

from dockyard.config.fields import OpenSection, component, field


class RewardSpec(OpenSection):
    """Extra keys are passed to the reward's constructor."""

    name: component("reward") = field(..., "Reward function (see `dockyard list`).")


class SandboxConfig(OpenSection):
    """Extra keys are passed to the sandbox backend."""

    type: component("sandbox") = field("bubblewrap", "Sandbox backend (see `dockyard list`).")
    image: Optional[str] = field(None, "Container image (podman / apptainer / enroot).")
    working_dir: str = field("/rl-sandbox", "Working directory inside the sandbox.")
    command_exec_timeout_s: float = field(600.0, "Timeout of one command inside the sandbox.", gt=0)
    creation_timeout_s: float = field(600.0, "Timeout to create one sandbox.", gt=0)
    max_concurrent: PositiveInt = field(32, "Sandboxes alive at once per rollout node.")
    trusted: bool = field(False, "Only with type none, which it must be set for: the policy's commands run on "
                          "this machine with no isolation (docs/agents.md).")
    uid_range: tuple[int, int] = field((200_000, 204_095), "User ids (first, last) the sandboxes run as when dockyard "
                                       "is root: two per live sandbox (the agent's, the verifier's); none may belong "
                                       "to a user, a group or a subuid range of this machine (checked before "
                                       "anything starts).")
    agent_user: Literal["auto", "root", "sandbox"] = field(
        "auto", "Who the agent (and a task's solution) runs as: root (uid 0 inside the sandbox's own user "
        "namespace, an unprivileged block of ids outside, the image's root folder writable through an overlay "
        "whose changes the verifier reads; as in Terminal-Bench and Harbor containers), sandbox (an "
        "unprivileged user of the sandbox's own), or auto (root on a task's built image when dockyard is root, "
        "else sandbox). docs/agents.md, root inside the sandbox.")
    root_uid_range: tuple[int, int] = field((1_000_000_000, 1_004_194_303), "Host user ids (first, last) for "
                                            "sandboxes whose agent is root: a block of 65536 per live sandbox; "
                                            "none may belong to a user, a group or a subuid range of this "
                                            "machine (checked before anything starts).")
    task_images: Literal["host", "build"] = field(
        "host", "Terminal tasks' Dockerfiles: build (each built into an image with podman, cached, and the sandbox "
        "runs on it: RUN lines take effect in podman and bubblewrap) or host (no build: WORKDIR, COPY and ENV "
        "applied, RUN lines run at creation in podman and skipped in bubblewrap). docs/agents.md, task images.")
    base_images: dict[str, str] = field(
        {}, "task_images build: published base -> local image for each Dockerfile's FROM (nothing is pulled). A "
        "base neither mapped nor in the local image store takes default_base_image, else is refused by name.")
    default_base_image: Optional[str] = field(
        None, "task_images build: the local image for every FROM that base_images does not map and the local "
        "store lacks (tools/build_base_image.sh builds localhost/dockyard-base:bookworm).")
    image_cache: Optional[str] = field(None, "task_images build: where build logs and the exported root folders "
                                       "bubblewrap runs on are kept, one folder per cache key; null: "
                                       "/var/cache/dockyard/task-images as root (the sandboxes' users must reach "
                                       "it), else ~/.cache/dockyard/task-images.")


class EnvConfig(OpenSection):
    """Per-environment settings beyond these keys are passed to the environment."""

    name: component("environment") = field(..., "Environment (see `dockyard list`).")
    agent: Optional[component("agent")] = field(None, "Multi-turn agent; null means single-turn.")
    reward: Optional[RewardSpec] = field(None, "Reward override; null uses the environment's own scorer.")
    sandbox: Optional[SandboxConfig] = field(None, "Tool-execution sandbox; null for tool-free environments.")
    num_workers: PositiveInt = field(4, "Trajectories scored at once (single-turn), episodes run at once per "
                                     "group (agents), tasks checked at once (dockyard env check).")
    task_timeout_s: float = field(1800.0, "Longest one trajectory may take in the environment: an agent "
                                  "episode's time, a single-turn scoring's time. Past it the trajectory fails "
                                  "(a scorer thread cannot be killed: it keeps its worker until it returns).", gt=0)
    dump_trajectory_path: Optional[str] = field(None, "Write every trajectory here for replay and analysis: "
                                                "<path>/train_step_<N>.jsonl and validation_step_<N>.jsonl.")
