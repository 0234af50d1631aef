"""Jobs in containers on the real dev cluster: what is refused before the queue, the hand-written template's
steps in the image, the environment a step gets in each runtime, llama.cpp in the image. grpo_tiny as a het job
in the image, preempted, requeued and resumed bitwise in slurm_oci, charliecloud and podman:
test_preemption_on_cluster.py."""

import subprocess

import pytest

from tests.conftest import REPO
from tests.launch.conftest import IMAGE_PYTHON, container_overrides, metrics, run_submit


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


@pytest.mark.parametrize("runtime", ["slurm_oci", "charliecloud", "podman"])
def test_a_step_in_the_image_has_the_images_env_and_not_the_submitters(runtime, slurm_cluster, dockyard_image,
                                                                      tmp_path, tiny_model):
    """What `dockyard container-step` renders (the lines of every step) run under srun: the image's ENV
    (HF_HUB_OFFLINE, the llama.cpp folder) arrives in every runtime (charliecloud passes it only from the
    job root's /ch/environment); the submitter's own variables do not."""
    import json
    import os
    import sys

    image = (dockyard_image / "complete").read_text().strip() if runtime == "podman" else str(dockyard_image)
    step = [sys.executable, "-m", "dockyard.cli", "container-step", "--config", "grpo_tiny.yaml", "--folder",
            str(tmp_path / "job"), *container_overrides(image, tiny_model, runtime)]
    words = {part: subprocess.run(step[:-3] + ["--part", part] + step[-3:], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=120) for part in ("srun-flags", "command")}
    for done in words.values():
        assert done.returncode == 0, done.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "DOCKYARD_LLAMA_CPP_DIR")}
    env["SUBMITTERS_OWN"] = "x"
    flags, command = ([word for word in words[part].stdout.splitlines() if word] for part in ("srun-flags", "command"))
    done = subprocess.run(["srun", "-N1", "-n1", "-w", "node4", *flags, *command,
                           "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    assert inside["HF_HUB_OFFLINE"] == "1" and inside["DOCKYARD_LLAMA_CPP_DIR"] == "/opt/llama.cpp"
    assert "SUBMITTERS_OWN" not in inside and inside["PATH"].startswith("/opt/dockyard/venv/bin:")
