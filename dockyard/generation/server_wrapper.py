"""What dockyard adds around a third-party server command (vLLM, SGLang) before it starts:

- `--port 0` picks a free port on this node and writes `{host, port, pid}` to --address-file, which
  the driver reads (a port chosen here cannot collide with another job's on a shared node);
- the sampling settings the run will send are checked for finiteness (docs/generation.md: a NaN/Inf
  temperature or top_p is refused where the worker starts, not forwarded to the engine);
- SIGUSR2 (Slurm's warning for the trainer) is ignored: the server must outlive it.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import socket
import sys
from pathlib import Path

from dockyard.errors import DockyardError
from dockyard.processes import publish_address


class SamplingRefused(DockyardError, ValueError):
    pass


def check_sampling(settings: dict) -> None:
    for key in ("temperature", "top_p", "eval_temperature"):
        value = settings.get(key)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SamplingRefused(f"policy.generation.{key}: must be a finite number (got {value!r}); "
                                  "the generation server refuses to start with it")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host if host not in ("", "0.0.0.0") else "", 0))
        return sock.getsockname()[1]


def _value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _set(args: list[str], flag: str, value: str) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out + [flag, value]


def prepare(argv: list[str], what: str) -> list[str] | None:
    """Parse `[--address-file F] [--sampling JSON] -- SERVER ARGS`; the server's arguments with a
    concrete port, or None after printing why the server must not start."""
    ours, serve = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    parser = argparse.ArgumentParser(description=f"dockyard's {what} server wrapper")
    parser.add_argument("--address-file", help="write {host, port, pid} here before serving")
    parser.add_argument("--sampling", default="{}", help="JSON of the run's sampling settings (checked)")
    args = parser.parse_args(ours)
    try:
        check_sampling(json.loads(args.sampling))
    except SamplingRefused as err:
        print(f"dockyard {what} server: {err}", file=sys.stderr, flush=True)
        return None
    if serve and not serve[0].startswith("-") and Path(serve[0]).is_dir():
        from dockyard.model_files import check_model_folder

        problems, _ = check_model_folder("", serve[0])   # changed since the preflight: named, not a traceback
        if problems:
            print(f"dockyard {what} server: model error: {'; '.join(p.message for p in problems)}", file=sys.stderr,
                  flush=True)
            return None
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    port = int(_value(serve, "--port") or 0)
    if port == 0:
        port = _free_port(_value(serve, "--host") or "")
        serve = _set(serve, "--port", str(port))
    if args.address_file:
        publish_address(args.address_file, port)
    return serve
