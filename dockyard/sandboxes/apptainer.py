"""apptainer and enroot sandboxes: the container runtimes of HPC clusters without a Docker daemon.

Both work like bubblewrap (host_folders.py): every command is a fresh container of the image, with
the workspace and the other sandbox folders bound into it, under `prlimit`; a persistent shell is a
long-lived container process. Neither runtime can be installed on this project's build machine, so
their command lines are what the tests check (tests/sandboxes/test_rendered_runtimes.py); a run on a
cluster that has them uses exactly these lines.

- apptainer (`env.sandbox.image`: a .sif file or a `docker://` / `oras://` reference already in the
  cache): `apptainer exec --containall --cleanenv --no-home --net --network none --writable-tmpfs`,
  so no host files but the binds, no variables from the trainer, its own pid and IPC namespaces, no
  network, a scratch overlay that vanishes with the command; as root it runs as the sandbox's own
  user id like bubblewrap.
- enroot (`env.sandbox.image`: a .sqsh file): `enroot create` makes the sandbox's container at
  creation and `enroot remove` deletes it; commands run with `enroot start --rw --mount ... --env`.
  enroot has no network namespace: its commands run under `unshare --net` when dockyard is root; as a
  normal user they share the host's network (the docs say so).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess

from dockyard.sandboxes.base import SandboxError
from dockyard.sandboxes.host_folders import HostFolderSandbox


class ApptainerSandbox(HostFolderSandbox):
    kind = "apptainer"

    @classmethod
    def refuses(cls, config) -> str | None:
        if shutil.which("apptainer") is None and shutil.which("singularity") is None:
            return ("env.sandbox.type: apptainer is not installed here (nor singularity): `module load apptainer` on "
                    "clusters that ship it, else the packages of https://apptainer.org/docs/admin/main/installation.html")
        if not getattr(config, "image", None):
            return "env.sandbox.image: an apptainer sandbox needs an image (a .sif file or a docker:// reference)"
        return None

    def runtime(self) -> str:
        return "apptainer" if shutil.which("apptainer") or not shutil.which("singularity") else "singularity"

    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        command = [self.runtime(), "exec", "--containall", "--cleanenv", "--no-home",
                   *([] if self.spec.network else ["--net", "--network", "none"]), "--writable-tmpfs",
                   "--pwd", cwd or self.workdir]
        for key, value in env.items():
            command += ["--env", f"{key}={value}"]
        for inside, host in sorted(self.mounts.items()):
            command += ["--bind", f"{host}:{inside}" + ("" if self.writable_mount(inside) else ":ro")]
        return [*self.user_and_limits(), *command, self.image, *argv]


class EnrootSandbox(HostFolderSandbox):
    kind = "enroot"

    @classmethod
    def refuses(cls, config) -> str | None:
        if shutil.which("enroot") is None:
            return ("env.sandbox.type: enroot is not installed here: the packages of "
                    "https://github.com/NVIDIA/enroot/blob/master/doc/installation.md (with Pyxis on Slurm clusters)")
        image = getattr(config, "image", None)
        if not image or not str(image).endswith(".sqsh"):
            return "env.sandbox.image: an enroot sandbox needs a squashfs image file (enroot import -o IMAGE.sqsh ...)"
        return None

    def __init__(self, *args, **kwargs):
        self.container = "dockyard-" + secrets.token_hex(6)
        self.created = False
        super().__init__(*args, **kwargs)
        result = subprocess.run(self.create_command(), capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            self.destroy()
            raise SandboxError(f"{self.spec.name}: enroot create failed: {result.stderr.strip()[-500:]}")
        self.created = True

    def create_command(self) -> list[str]:
        return ["enroot", "create", "--name", self.container, self.image]

    def user_and_limits(self) -> list[str]:
        # enroot runs as the invoking user (its container lives in that user's enroot data folder)
        network = ["unshare", "--net", "--"] if os.geteuid() == 0 and not self.spec.network else []
        return [*network, "prlimit", *self.limits.prlimit(sandbox_capped=False), "--"]

    def wrap(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> list[str]:
        command = ["enroot", "start", "--rw"]
        for key, value in env.items():
            command += ["--env", f"{key}={value}"]
        for inside, host in sorted(self.mounts.items()):
            create = "file" if inside in self.file_mounts else "dir"
            command += ["--mount", f"{host}:{inside}:x-create={create},bind" + ("" if self.writable_mount(inside) else ",ro")]
        # enroot start has no working-directory flag: the command starts there itself
        return [*self.user_and_limits(), *command, self.container, "sh", "-c", 'cd "$1" && shift && exec "$@"',
                "enroot-start", cwd or self.workdir, *argv]

    def _teardown(self) -> None:
        if self.created:
            subprocess.run(["enroot", "remove", "--force", self.container], capture_output=True, timeout=120)
        super()._teardown()
