"""submitit's Slurm executor, extended to heterogeneous jobs.

submitit renders component 0 (the trainer) exactly as usual: its #SBATCH block, job folder, result
pickles, logs, the USR2 signal and the requeue path all stay submitit's. The other components
(rollout, teacher servers) are #SBATCH blocks appended after a `#SBATCH hetjob` separator; their
processes are started by the driver inside the job (`srun --het-group=k`), not by submitit, so the
Job waits for the trainer tasks' results only. sacct lists a het job's rows as `N+0`, `N+1`, ...:
the watcher reads the leader's `N+0` row as the job's state (stock submitit would say UNKNOWN).
"""

from __future__ import annotations

import re
import typing as tp

from submitit.core.core import PicklingExecutor
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob, _as_sbatch_flag

from dockyard.launch.startup_guard import guarded_python

_COMPONENT_ROW = re.compile(r"^(\d+)\+(\d+)(\.\S*)?\|")


class HetSlurmInfoWatcher(SlurmInfoWatcher):
    def read_info(self, string: tp.Union[bytes, str]) -> tp.Dict[str, tp.Dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        lines = []
        for line in text.splitlines():
            match = _COMPONENT_ROW.match(line)
            if match is None:
                lines.append(line)
            elif match.group(2) == "0" and not match.group(3):
                lines.append(match.group(1) + line[match.end() - 1:])
        return super().read_info("\n".join(lines))


class HetSlurmJob(SlurmJob):
    # one sacct call every few seconds for all jobs of this process (submitit's default is 600 s)
    watcher = HetSlurmInfoWatcher(delay_s=5)


class HetSlurmExecutor(SlurmExecutor):
    job_class = HetSlurmJob

    def __init__(self, folder, extra_components: tp.Sequence[dict[str, tp.Any]] = (), require_slurm: bool = True,
                 **kwargs) -> None:
        if require_slurm:
            super().__init__(folder, **kwargs)
        else:  # --dry-run renders the script on a machine without Slurm (SlurmExecutor insists on srun)
            PicklingExecutor.__init__(self, folder, **kwargs)
        # the trainer tasks start with USR2 / SIGTERM blocked until dockyard handles them
        self.python = guarded_python()
        self.extra_components = [dict(c) for c in extra_components]

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        text = super()._make_submission_file_text(command, uid)
        if not self.extra_components:
            return text
        lines = text.split("\n")
        last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
        blocks = []
        for k, component in enumerate(self.extra_components, start=1):
            blocks += ["#SBATCH hetjob", f"# het group {k}"]
            blocks += [_as_sbatch_flag(key, value) for key, value in sorted(component.items())]
        lines[last + 1:last + 1] = blocks
        return "\n".join(lines)
