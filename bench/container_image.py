"""The dockyard image and jobs in it (cluster.container, docs/slurm.md "Run in a container"): image build
time cold and cached, image size, and submit -> first step with and without the container on the local
dev cluster (Slurm's OCI mode with runc, podman, and Charliecloud where ch-run is installed).

    .venv/bin/python bench/container_image.py [--output /var/tmp/dockyard-bench-images] [--repeats 2]

Cold is `dockyard image build --force` on a base already made (tools/build_base_image.sh, about a
minute more the first time); cached is the same call again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from submit_latency import MILESTONES, REPO, one_run  # noqa: E402


def build(output: Path, force: bool) -> tuple[float, Path]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "dockyard.cli", "image", "build", "--output", str(output),
                             *(["--force"] if force else [])], capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        sys.exit(result.stderr)
    return time.perf_counter() - started, Path(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("/var/tmp/dockyard-bench-images"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cold, folder = build(args.output, force=True)
    cached, _ = build(args.output, force=False)
    info = json.loads((folder / "image.json").read_text())
    rootfs = subprocess.run(["du", "-sb", str(folder / "bundle" / "rootfs")], capture_output=True, text=True).stdout
    print(f"image {info['tag']}: build cold {cold:.0f} s (podman build {info['build_s']:.0f} s), cached "
          f"{cached:.1f} s; podman image {info['size_bytes'] / 1e9:.2f} GB, bundle rootfs "
          f"{int(rootfs.split()[0]) / 1e9:.2f} GB", flush=True)
    def container(runtime: str, image: str) -> tuple[str, ...]:
        return (f"cluster.container.runtime={runtime}", f"cluster.container.image={image}",
                f"cluster.container.mounts=[{REPO / 'models'}:{REPO / 'models'}:ro]")

    runtimes = [("venv", ()), ("slurm_oci", container("slurm_oci", str(folder))),
                ("podman", container("podman", info["tag"]))]
    if shutil.which("ch-run"):
        runtimes.append(("charliecloud", container("charliecloud", str(folder))))
    for label, extra in runtimes:
        runs = [one_run("grpo_tiny.yaml", 3, 600, extra) for _ in range(args.repeats)]
        print(f"grpo_tiny on 3 nodes, {label}: " + "  ".join(
            f"{m} {statistics.median(r[m] for r in runs):.1f}s" for m in MILESTONES), flush=True)


if __name__ == "__main__":
    main()
