"""Stopping a run early without losing work: signals and the allocation's deadline, turned into one
decision every rank takes at the same safe point.

A handler only records what arrived (nothing unsafe runs inside a signal handler); the loop asks
`agree()` at its safe points (the top of a step, and after the rollout batch reached every rank),
where all ranks meet anyway: one all-reduce (MAX) makes the decision collective, so either every
rank saves or none does.

  SIGTERM   preemption (after the grace time, or without preempt_send_user_signal) or scancel: save;
            the requeue is Slurm's decision (a preempted job is requeued, a cancelled one is not)
  USR2      submitit's signal before the time limit (and at preemption where the cluster sends the
            job's own signal): save, then requeue
  deadline  the allocation's end is closer than the longest step + the longest save + a margin:
            save, then requeue (for clusters where no signal comes in time)
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist

from dockyard.processes import STOP_SIGNALS

NONE, TERM, USR2, DEADLINE = 0, 1, 2, 3
DESCRIPTION = {TERM: "SIGTERM (preemption, scancel, or a stopped dockyard run)", USR2: "USR2 (time limit near, or preemption)",
               DEADLINE: "the allocation's end time is near"}


class RunStopped(Exception):
    """Raised by the loop once the state is saved; the launcher decides what follows (requeue, exit)."""

    def __init__(self, code: int, step: int):
        super().__init__(f"stopped after step {step}: {DESCRIPTION[code]}")
        self.code, self.step = code, step

    @property
    def wants_requeue(self) -> bool:
        return self.code in (USR2, DEADLINE)


class StopRequests:
    can_stop = True   # a stop may come: the runner keeps what it needs to drop a step

    def __init__(self, device: torch.device | None, deadline: float | None = None, margin_s: float = 30.0,
                 on_signal: Callable[[], None] | None = None):
        self.device, self.deadline, self.margin_s, self.on_signal = device, deadline, margin_s, on_signal
        self.local = NONE
        self.last = NONE
        self.arrived_at: float | None = None
        self.longest_step_s = 0.0
        self.longest_save_s = 0.0

    def install(self) -> "StopRequests":
        signal.signal(signal.SIGUSR2, self._handle)
        signal.signal(signal.SIGTERM, self._handle)
        # A launcher that starts this process with the stop signals blocked (launch/startup_guard.py)
        # keeps a signal sent during start-up pending instead of letting its default action kill the
        # process; unblocking now delivers it to the handler above.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return self

    def _handle(self, signum, frame) -> None:
        code = USR2 if signum == signal.SIGUSR2 else TERM
        if self.arrived_at is None:
            self.arrived_at = time.time()
        self.local = max(self.local, code)
        print(f"dockyard: received {DESCRIPTION[code]}; saving at the next safe point", file=sys.stderr, flush=True)
        if self.on_signal is not None:
            threading.Thread(target=self.on_signal, name="stop-callback", daemon=True).start()

    @property
    def requested(self) -> bool:
        return self.local != NONE

    def note_step(self, seconds: float) -> None:
        self.longest_step_s = max(self.longest_step_s, seconds)

    def note_save(self, seconds: float) -> None:
        self.longest_save_s = max(self.longest_save_s, seconds)

    def deadline_near(self, now: float | None = None) -> bool:
        if self.deadline is None:
            return False
        left = self.deadline - (time.time() if now is None else now)
        return left < self.longest_step_s + self.longest_save_s + self.margin_s

    def agree(self) -> int:
        """Collective: the strongest reason any rank has (NONE to carry on)."""
        code = max(self.local, DEADLINE if self.deadline_near() else NONE)
        if dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([code], dtype=torch.int32, device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            code = int(flag.item())
        if code == DEADLINE and self.arrived_at is None:
            self.arrived_at = time.time()
        self.last = code
        return code


class NoStops(StopRequests):
    """The stopper of a trainer nobody can stop (one built outside an entry point, in a test or a
    bench): never requested, and its agreement is no collective."""
    can_stop = False

    def __init__(self):
        super().__init__(device=None)

    def install(self) -> "StopRequests":
        raise RuntimeError("NoStops takes no signals; install a StopRequests")

    def agree(self) -> int:
        return NONE
