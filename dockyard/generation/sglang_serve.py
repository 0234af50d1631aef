"""Starts one SGLang server (`python -m sglang.launch_server`), wrapped for dockyard (free port +
address file, the sampling check, USR2 ignored: see server_wrapper.py).

    python -m dockyard.generation.sglang_serve --address-file F --sampling '{...}' -- --model-path M --port 0 ...
"""

from __future__ import annotations

import os
import sys

from dockyard.generation.server_wrapper import prepare


def main(argv: list[str] | None = None) -> int:
    serve = prepare(list(sys.argv[1:] if argv is None else argv), "SGLang")
    if serve is None:
        return 2
    os.execv(sys.executable, [sys.executable, "-m", "sglang.launch_server", *serve])


if __name__ == "__main__":
    sys.exit(main())
