"""The one base of the package's error classes.

A DockyardError is a problem a user can act on: its message already names the field, file, server or
log at fault, so an entry point prints it as it is, without a traceback, and exits with its status.
Each class keeps its builtin base too (ValueError for bad input, RuntimeError for a failed part,
OSError for a missing file...) so code that catches those keeps working.

Exceptions used for control flow (a stop request, an abandoned step) are not DockyardErrors.
"""

from __future__ import annotations

EXIT_INPUT = 2       # the config, a file or an input is wrong: fix it and start again
EXIT_COMPONENT = 3   # a part of the job (a server, a sandbox, a peer) failed or did not answer


class DockyardError(Exception):
    exit_status: int = EXIT_INPUT
    label: str = ""   # what kind of problem, printed before the message ("model error: ...")

    def report(self) -> str:
        return f"{self.label}: {self}" if self.label else str(self)


class ComponentError(DockyardError):
    """A running part of the job failed, not the user's input."""
    exit_status = EXIT_COMPONENT
