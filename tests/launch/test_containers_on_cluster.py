"""Jobs in containers on the real dev cluster: what is refused before the queue, and the hand-written
template's steps in the image, grpo_tiny as a het job in podman. In slurm_oci and charliecloud the het job is
also preempted, requeued and resumed bitwise: test_preemption_on_cluster.py."""

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.launch.conftest import IMAGE_PYTHON, container_overrides, metrics, run_submit
from tests.launch.test_submit_on_cluster import job_id_of


@pytest.fixture(scope="module")
def venv_first_loss(slurm_cluster, tmp_path_factory, tiny_model) -> float:
    """The first step's loss of the same job in the submitting environment's .venv."""
    outside = tmp_path_factory.mktemp("venv")
    plain = run_submit(outside, tiny_model, "--nodes", "3", "--wait", timeout=900)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    return metrics(outside)[0]["train/loss"]


@pytest.mark.parametrize("runtime", ["podman"])   # slurm_oci, charliecloud: preempted too (test_preemption_on_cluster.py)
def test_grpo_tiny_runs_as_a_het_job_every_step_in_the_image(runtime, slurm_cluster, dockyard_image, venv_first_loss,
                                                             tmp_path, tiny_model):
    """Trainer tasks on two nodes and the rollout server on a third, all inside the image (its own Python,
    which the host does not have), each knowing its node and rank although Slurm's OCI mode passes no
    per-task variable; the run trains as the .venv run of the same config does; no container is left."""
    image = (dockyard_image / "complete").read_text().strip()
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", "--wait", *container_overrides(image, tiny_model, runtime),
                        timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not Path(IMAGE_PYTHON).exists()   # so a step that ran it ran in the image
    job = job_id_of(result.stdout)
    folder = tmp_path / "slurm"
    trainer = [(folder / f"{job}_{rank}_log.err").read_text() for rank in (0, 1)]
    server = (folder / f"{job}.0_rollout0_node3.log").read_text()
    assert f"dockyard: container: trainer in {runtime} {image}; {IMAGE_PYTHON}; node node1 task 0" in trainer[0]
    assert f"dockyard: container: trainer in {runtime} {image}; {IMAGE_PYTHON}; node node2 task 1" in trainer[1]
    assert "trainer rank 0/2 on node1" in trainer[0] and "trainer rank 1/2 on node2" in trainer[1]
    assert f"dockyard: container: rollout in {runtime} {image}; {IMAGE_PYTHON}; node node3 task 0" in server
    assert "serving on 0.0.0.0" in server
    # the submitter's PYTHONPATH (this checkout) stayed outside: the image's dockyard ran
    assert str(REPO) not in "".join(trainer)
    steps = metrics(tmp_path)
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert steps[0]["train/loss"] == venv_first_loss
    if runtime == "podman":   # the server's container, which srun's end of the step does not reach, is gone
        left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
        ours = (f"dockyard-{job}-", f"dockyard-{int(job) + 1}-")   # the trainer's component, the rollout's
        assert not [name for name in left.split() if name.startswith(ours)], left


def test_a_missing_image_runtime_or_mount_is_refused_before_the_queue(slurm_cluster, tmp_path, tiny_model):
    overrides = container_overrides(tmp_path / "no-image", tiny_model) + ["cluster.container.rollout.mounts=[/nowhere:/data]"]
    result = run_submit(tmp_path, tiny_model, "--nodes", "3", *overrides)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cluster.container.image: " in result.stderr and "is not an image folder of `dockyard image build`" in result.stderr
    assert "cluster.container.rollout.mounts: /nowhere:/data: the source /nowhere does not exist" in result.stderr
    assert "nothing was submitted" in result.stderr and "Traceback" not in result.stderr
    for runtime, why in (("charliecloud", "is neither an image folder of `dockyard image build`, a Charliecloud image"),
                         ("pyxis", "srun has no --container-image option")):
        result = run_submit(tmp_path, tiny_model, "--nodes", "3", f"cluster.container.runtime={runtime}",
                            f"cluster.container.image={tmp_path}")
        assert result.returncode == 2 and why in result.stderr, result.stderr


def test_the_hand_written_template_runs_its_steps_in_the_image(slurm_cluster, dockyard_image, tmp_path, tiny_model):
    """slurm/grpo_het.sbatch asks `dockyard container-step` for srun's options (the bundles written into
    its job folder) and the words that start the trainer step in the image."""
    import os
    import sys

    env = dict(os.environ, CONFIG="grpo_tiny.yaml", PYTHON=sys.executable, DOCKYARD_HOME=str(REPO),
               PYTHONPATH=str(REPO))
    overrides = container_overrides(dockyard_image, tiny_model)
    overrides[-1] = f"cluster.container.mounts=[{tiny_model.parent}:{tiny_model.parent}:ro,{REPO / 'jobs'}:{REPO / 'jobs'}:ro]"
    result = subprocess.run(["sbatch", "--wait", "--parsable", f"--output={tmp_path}/job.out",
                             str(REPO / "slurm" / "grpo_het.sbatch"), f"models_dir={tiny_model.parent}", *overrides],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").is_file() else ""
    assert result.returncode == 0, result.stderr + output
    job = result.stdout.strip().split(";")[0]
    assert f"dockyard: container: trainer in slurm_oci {dockyard_image}; {IMAGE_PYTHON}; node node2 task 1" in output
    server = next((tmp_path / "runs" / f"slurm-{job}").glob("*_rollout0_node3.log")).read_text()
    assert f"dockyard: container: rollout in slurm_oci {dockyard_image}" in server
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2, 3, 4]


def test_the_image_exports_gguf_with_its_own_llama_cpp(dockyard_image, tmp_path):
    """llama.cpp's converter and quantizer are in the image: `dockyard export gguf` runs there with
    nothing of the host's but the model and the output folder, and its builds validate."""
    smol = REPO / "models" / "smollm2-135m-instruct"   # llama.cpp knows its tokenizer (the tiny model's it does not)
    tag = (dockyard_image / "complete").read_text().strip()
    result = subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--network=none", "--ulimit=nofile=20000:20000",
                             "--ulimit=nproc=4096:4096",
                             "--volume", f"{smol}:/model:ro", "--volume", f"{tmp_path}:/out", tag,
                             "dockyard", "export", "gguf", "--hf", "/model", "--out", "/out/tiny", "--quant", "f16",
                             "--quant", "Q8_0"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["tiny-Q8_0.gguf", "tiny-f16.gguf"]
    from dockyard.io.gguf_export import validate_gguf

    for build in tmp_path.glob("*.gguf"):
        assert validate_gguf(build, smol)["architecture"] == "llama", build
