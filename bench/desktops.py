"""Desktop figures (env osworld, docs/environments.md): what a desktop in a sandbox costs.

    .venv/bin/python bench/desktops.py [--kinds bubblewrap,podman,podman-image] [--repeats 5] [--most 8]

`podman-image` runs the desktops on the desktop image (tools/build_desktop_image.sh, built first if missing,
its build time printed) instead of this machine's /usr. Prints, per sandbox kind:
- start: creating the sandbox and its desktop (Xvfb, buses, openbox) until the first observation
  (the accessibility tree, linearised) is in hand; then with a terminal opened (`launch`, its window up);
- observations on that desktop: the accessibility tree (read and linearised) and a PNG screenshot;
- an action's round trip: a key typed into the terminal, and the same followed by the observation
  the agent gets (the episode's sleep_after_action_s left out);
- memory of one live desktop with a terminal, and with the text editor too: the resident set of every
  process in the sandbox (read inside: its own pid namespace holds only the desktop);
- how many desktops this machine holds at once: 1, 2, 4, ... --most desktops started together, each
  with a terminal, until one does not come up; the time until all were up and their memory.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dockyard.config.schema.env import SandboxConfig       # noqa: E402
from dockyard.desktop.observation import linearize         # noqa: E402
from dockyard.desktop.session import DesktopSession        # noqa: E402
from dockyard.sandboxes.base import SandboxSpec            # noqa: E402
from dockyard.sandboxes.factory import SandboxFactory      # noqa: E402

REPO = Path(__file__).resolve().parent.parent
IMAGE = "localhost/dockyard-desktop:bookworm"
WIDTH, HEIGHT = 1280, 720
MEMORY = "ps -eo rss= | awk '{s += $1} END {print s}'"


def median(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.0f} ms"


def start(factory: SandboxFactory, name: str) -> tuple[object, DesktopSession, float]:
    began = time.monotonic()
    sandbox = factory.create(SandboxSpec(workdir="/home/user", name=name))
    desktop = DesktopSession(sandbox, WIDTH, HEIGHT, start_timeout_s=120).start()
    linearize(desktop.a11y_tree()["xml"], WIDTH, HEIGHT, 6000)
    return sandbox, desktop, time.monotonic() - began


def stop(sandbox, desktop) -> None:
    desktop.close()
    sandbox.destroy()


def rss_mb(desktop: DesktopSession) -> float:
    return int(desktop.run(MEMORY, shell=True)["output"].strip() or 0) / 1024


def one_kind(kind: str, repeats: int, most: int) -> None:
    print(f"\n== {kind} ==")
    image = {}
    if kind == "podman-image":
        began = time.monotonic()
        built = subprocess.run(["bash", str(REPO / "tools" / "build_desktop_image.sh"), IMAGE], capture_output=True,
                               text=True, timeout=1800)
        if built.returncode != 0:
            raise SystemExit(built.stderr)
        print(f"image: {built.stdout.strip()} ({time.monotonic() - began:.0f} s here)")
        kind, image = "podman", {"image": IMAGE, "agent_user": "sandbox"}
    factory = SandboxFactory(SandboxConfig(type=kind, max_concurrent=max(most, 1), creation_timeout_s=300, **image))
    starts, with_terminal = [], []
    for n in range(repeats):
        sandbox, desktop, seconds = start(factory, f"bench {n}")
        starts.append(seconds)
        began = time.monotonic()
        desktop.request("launch", command=["gnome-terminal"])
        with_terminal.append(seconds + time.monotonic() - began)
        stop(sandbox, desktop)
    print(f"start to first observation          {median(starts)}   (median of {repeats})")
    print(f"  with a terminal's window up        {median(with_terminal)}")

    sandbox, desktop, _ = start(factory, "bench observe")
    try:
        desktop.request("launch", command=["gnome-terminal"])
        time.sleep(1)
        trees, shots, keys, rounds = [], [], [], []
        nodes = 0
        for _ in range(repeats * 2):
            began = time.monotonic()
            tree = desktop.a11y_tree()
            linearize(tree["xml"], WIDTH, HEIGHT, 6000)
            trees.append(time.monotonic() - began)
            nodes = tree["nodes"]
            began = time.monotonic()
            png = desktop.screenshot()
            shots.append(time.monotonic() - began)
            began = time.monotonic()
            desktop.act([{"kind": "type", "text": "x"}])
            keys.append(time.monotonic() - began)
            began = time.monotonic()
            desktop.act([{"kind": "keys", "keys": ["BackSpace"]}])
            linearize(desktop.a11y_tree()["xml"], WIDTH, HEIGHT, 6000)
            rounds.append(time.monotonic() - began)
        print(f"accessibility tree ({nodes} nodes)      {median(trees)}")
        print(f"screenshot ({WIDTH}x{HEIGHT} PNG, {len(png) // 1024} KiB)  {median(shots)}")
        print(f"action round trip (a key)            {median(keys)}")
        print(f"  and the next observation           {median(rounds)}")
        print(f"memory, desktop + terminal           {rss_mb(desktop):7.0f} MB resident")
        desktop.request("launch", command=["mousepad"])
        time.sleep(1)
        print(f"  + the text editor                  {rss_mb(desktop):7.0f} MB resident")
    finally:
        stop(sandbox, desktop)

    count = 1
    while count <= most:
        began = time.monotonic()

        def up(n: int):
            sandbox, desktop, _ = start(factory, f"bench many {n}")
            desktop.request("launch", command=["gnome-terminal"])
            return sandbox, desktop

        # the pool's threads outlive the desktops: a sandbox dies with the thread that started it (bwrap's
        # --die-with-parent is the parent death signal, which follows the starting thread)
        with ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(up, n) for n in range(count)]
            live, failed = [], []
            for future in futures:
                try:
                    live.append(future.result())
                except Exception as err:   # a desktop that did not come up ends the series
                    failed.append(f"{type(err).__name__}: {err}")
            seconds = time.monotonic() - began
            memory = sum(rss_mb(desktop) for _, desktop in live)
            list(pool.map(lambda pair: stop(*pair), live))
        state = "all up" if not failed else f"{len(failed)} failed: {failed[0][:120]}"
        print(f"{count} desktops at once: {state} in {seconds:5.1f} s, {memory:6.0f} MB resident together "
              f"({memory / max(len(live), 1):.0f} MB each)")
        if failed:
            break
        count *= 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default="bubblewrap,podman,podman-image")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--most", type=int, default=8, help="the largest number of desktops started at once")
    args = parser.parse_args()
    for kind in args.kinds.split(","):
        one_kind(kind, args.repeats, args.most)


if __name__ == "__main__":
    main()
