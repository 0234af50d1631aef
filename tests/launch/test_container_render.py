"""cluster.container's command lines checked against each tool's documented options (pyxis + enroot and
Apptainer cannot run on this machine: no Debian or PyPI package; charliecloud's also run on the dev cluster), and
the container entry's environment filter (it runs in every runtime)."""

import json
import re

import pytest

from dockyard.config import load_config
from dockyard.launch.container_entry import main as entry_main, step_environment
from dockyard.launch.containers import step_container
from tests.conftest import REPO

PYTHON = "/opt/dockyard/venv/bin/python"
SERVE = ["/home/u/.venv/bin/python", "-m", "dockyard.generation.server", "--model", "/models/m"]


def container(runtime: str, *overrides: str, component: str = "rollout", job="/shared/jobs"):
    cfg = load_config("grpo_tiny.yaml", [f"cluster.container.runtime={runtime}", "cluster.container.image=/img/d.sif",
                                         "cluster.container.mounts=[/models:/models:ro,/scratch/hf:/root/.cache/hf]",
                                         "cluster.container.env=[HF_TOKEN]", "logger.log_dir=/shared/run/logs",
                                         "checkpointing.checkpoint_dir=/shared/run/ckpt", *overrides]).config
    return step_container(cfg, component, job)


def test_apptainer_exec_binds_the_mounts_and_the_runs_folders_and_keeps_the_host_pid_namespace(monkeypatch):
    monkeypatch.setenv("DOCKYARD_SUBMIT_DIR", "/shared/work")
    command = container("apptainer").server_command(SERVE)
    # apptainer exec [options] IMAGE COMMAND: --bind src:dest[:ro], --pwd, --contain, --no-home
    assert command[:4] == ["apptainer", "exec", "--contain", "--no-home"]
    binds = [command[i + 1] for i, word in enumerate(command) if word == "--bind"]
    assert binds[:2] == ["/models:/models:ro", "/scratch/hf:/root/.cache/hf"]
    assert {"/shared/work:/shared/work", "/shared/run/logs:/shared/run/logs", "/shared/run/ckpt:/shared/run/ckpt",
            "/shared/jobs:/shared/jobs"} <= set(binds)
    assert "--containall" not in command and "--pid" not in command   # the step must not be PID 1
    image = command.index("/img/d.sif")
    assert command[image - 2:image] == ["--pwd", "/shared/work"]
    assert command[image + 1:image + 3] == [PYTHON, "-m"]   # a server is not started guarded: it must hear TERM
    assert command[-8:] == ["bash", "-c", 'trap "" USR2; exec "$@"', "dockyard-server", PYTHON, *SERVE[1:]][-8:]
    gpu = container("apptainer", "cluster.gpus_per_node=1").server_command(SERVE)
    assert "--nv" in gpu


def test_the_slurm_configuration_that_slurm_conf_names_is_bound_read_only_and_never_all_of_etc(monkeypatch, tmp_path):
    """srun inside a step talks to the cluster that started the job: SLURM_CONF's folder goes in read-only;
    a slurm.conf kept directly in /etc goes in as its files, or the host's /etc would hide the image's."""
    site = tmp_path / "site-slurm"
    site.mkdir()
    (site / "slurm.conf").write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(site / "slurm.conf"))
    binds = container("apptainer").mounts
    assert any(m.source == str(site) and m.target == str(site) and m.read_only for m in binds)
    assert not any(m.source == "/etc/slurm" for m in binds)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm.conf")
    binds = container("apptainer").mounts
    assert not any(m.source in ("/etc", "/") for m in binds)


def test_charliecloud_ch_run_binds_and_keeps_the_environment_for_the_entry_to_filter(monkeypatch):
    monkeypatch.setenv("DOCKYARD_SUBMIT_DIR", "/shared/work")
    monkeypatch.delenv("USER", raising=False)
    words = container("charliecloud", "cluster.container.image=/img/dockyard", component="trainer").python_words()
    # ch-run [OPTION...] IMAGE -- CMD [ARG...]: -b/--bind=SRC[:DST], -c/--cd=DIR; it stops when $USER is unset
    assert words.startswith("env USER=") and " ch-run --bind=/models:/models --bind=/scratch/hf:/root/.cache/hf " in words
    # a directory image runs from the job's linked root (its mount targets made), with the image's ENV
    # from the /ch/environment written there
    assert ("--set-env --env-no-expand --cd=/shared/work /shared/jobs/charliecloud/trainer -- env --block-signal=USR2 "
            "--block-signal=TERM " + PYTHON) in words
    assert "--unset-env" not in words   # Slurm's variables must reach the entry
    assert words.endswith("--keep=HF_TOKEN '--name=trainer in charliecloud /img/dockyard' -- " + PYTHON)
    squashfs = container("charliecloud", "cluster.container.image=/img/dockyard.sqfs").server_command(SERVE)
    assert squashfs[squashfs.index("--cd=/shared/work") + 1:][:2] == ["/img/dockyard.sqfs", "--"]   # ch-run mounts it


def test_pyxis_flags_are_srun_options_and_the_trainer_task_runs_the_images_python(monkeypatch):
    monkeypatch.setenv("DOCKYARD_SUBMIT_DIR", "/shared/work")
    step = container("pyxis", "cluster.container.image=/img/dockyard.sqsh", component="trainer")
    flags = step.srun_flags("/shared/jobs")
    # pyxis: --container-image=PATH|IMAGE, --container-mounts=SRC:DST[:FLAGS][,...], --container-workdir=PATH
    assert flags[0] == "--container-image=/img/dockyard.sqsh"
    assert flags[1].startswith("--container-mounts=/models:/models:ro,/scratch/hf:/root/.cache/hf,/shared/work:")
    assert "--container-workdir=/shared/work" in flags and "--no-container-mount-home" in flags
    assert step.wrapper() == []
    assert step.python_words().startswith("env --block-signal=USR2 --block-signal=TERM " + PYTHON)


def test_podman_steps_go_through_the_wrapper_that_removes_the_container(monkeypatch):
    monkeypatch.setenv("DOCKYARD_SUBMIT_DIR", "/shared/work")
    command = container("podman", "cluster.container.image=localhost/dockyard:abc").server_command(SERVE)
    assert command[0].endswith("dockyard/launch/podman_step.sh") and command[1] == "run"
    assert "--network=host" in command and "--pid=host" in command and "--rm" in command
    assert command[command.index("--workdir") + 1] == "/shared/work"
    assert "/models:/models:ro" in command


def test_a_mount_that_is_not_src_dst_is_refused_by_name():
    from dockyard.config import ConfigError

    with pytest.raises(ConfigError, match=r"cluster.container.rollout.mounts: cluster.container: 'models' is not"):
        load_config("grpo_tiny.yaml", ["cluster.container.runtime=apptainer", "cluster.container.image=/i.sif",
                                       "cluster.container.rollout.mounts=[models]"])


def test_the_entry_keeps_the_steps_variables_and_drops_the_submitters_environment():
    submitter = {"PATH": "/home/u/.venv/bin:/usr/bin", "PYTHONPATH": "/home/u/dockyard", "VIRTUAL_ENV": "/home/u/.venv",
                 "LD_LIBRARY_PATH": "/opt/cuda/lib", "HF_TOKEN": "t", "WANDB_API_KEY": "w", "SLURM_JOB_ID": "7",
                 "SUBMITIT_FOLDER": "/j", "DOCKYARD_CONFIG": "/c.yaml", "USER": "u", "HOME": "/nonexistent-home",
                 "SLURM_PROCID": "1"}
    env = step_environment(submitter, {"HF_TOKEN"}, PYTHON)
    assert env["PATH"].startswith("/opt/dockyard/venv/bin:") and "/home/u" not in env["PATH"]
    for gone in ("PYTHONPATH", "LD_LIBRARY_PATH", "WANDB_API_KEY"):
        assert gone not in env
    assert env["HF_TOKEN"] == "t" and env["SLURM_JOB_ID"] == "7" and env["DOCKYARD_CONFIG"] == "/c.yaml"
    assert env["HOME"] == "/tmp"   # the submitter's home is not there to write caches to
    # the image's own ENV stays (a runtime passes it in beside the submitter's)
    image = dict(submitter, HF_HUB_OFFLINE="1", DOCKYARD_LLAMA_CPP_DIR="/opt/llama.cpp",
                 DOCKYARD_IMAGE_ENV="HF_HUB_OFFLINE DOCKYARD_LLAMA_CPP_DIR")
    env = step_environment(image, set(), PYTHON)
    assert env["HF_HUB_OFFLINE"] == "1" and env["DOCKYARD_LLAMA_CPP_DIR"] == "/opt/llama.cpp"
    assert "HF_TOKEN" not in env and "PYTHONPATH" not in env


@pytest.mark.parametrize("recipe", ["dockyard.Containerfile", "dockyard-cuda.Containerfile"])
def test_the_image_lists_every_variable_its_env_sets_for_the_entry_to_keep(recipe):
    text = (REPO / "containers" / recipe).read_text()
    listed = re.search(r'^ENV DOCKYARD_IMAGE_ENV="([^"]*)"', text, re.M).group(1).split()
    # ENV NAME=VALUE [NAME=VALUE ...], continued over lines
    instructions = re.findall(r"^ENV ((?:.*\\\n)*.*)$", text, re.M)
    names = {name for body in instructions for name in re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", body)}
    assert set(listed) == names - {"PATH", "VIRTUAL_ENV", "DOCKYARD_IMAGE_ENV"}   # those two: from the image's Python
    definition = (REPO / "containers" / "dockyard.def").read_text()
    assert f'DOCKYARD_IMAGE_ENV="{" ".join(listed)}"' in definition


def test_the_entry_recovers_the_task_variables_slurms_oci_mode_drops():
    # in a batch job the batch step's task variables arrive: 0 whatever the node
    step = {"SLURM_STEP_NODELIST": "node[1-2],gpu7", "SLURMD_NODENAME": "gpu7", "SLURM_JOB_GPUS": "0,1",
            "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"}
    assert step_environment(step, set(), PYTHON)["SLURM_PROCID"] == "0"   # other runtimes pass them right
    env = step_environment(step, set(), PYTHON, task_from_node=True)
    assert (env["SLURM_PROCID"], env["SLURM_NODEID"], env["SLURM_LOCALID"]) == ("2", "2", "0")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["SLURM_STEP_NUM_TASKS"] == "3"


def test_the_entry_names_a_node_it_cannot_place(capsys):
    import os

    os.environ.pop("SLURM_PROCID", None)
    os.environ["SLURM_STEP_NODELIST"], os.environ["SLURMD_NODENAME"] = "node[1-2]", "elsewhere"
    try:
        assert entry_main(["--keep=", "--", "/bin/true"]) == 2
    finally:
        del os.environ["SLURM_STEP_NODELIST"], os.environ["SLURMD_NODENAME"]
    assert "this node (elsewhere) is not in SLURM_STEP_NODELIST node[1-2]" in capsys.readouterr().err


def test_a_second_image_build_into_the_same_folder_waits_for_the_first_and_says_so(tmp_path, monkeypatch):
    import fcntl

    from dockyard.launch import image_build

    monkeypatch.setattr(image_build, "LOCK_TIMEOUT_S", 1.0)
    said = []
    with open(tmp_path / ".build.lock", "w") as held:   # a build running in another process
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(image_build.ImageError, match=r"another build into .* held .*\.build\.lock for 1 s"):
            image_build.build_image(tmp_path, say=said.append)
    assert said == [f"dockyard image build: another build into {tmp_path} is running; waiting for it (up to 1 s)"]


def test_a_bundle_is_hard_links_to_the_image_and_refused_by_name_across_file_systems(tmp_path, monkeypatch):
    import json
    import os
    from pathlib import Path

    from dockyard.launch.containers import ContainerError, write_bundle

    monkeypatch.setenv("DOCKYARD_SUBMIT_DIR", str(tmp_path))
    image = tmp_path / "image"
    (image / "bundle" / "rootfs" / "bin").mkdir(parents=True)
    (image / "bundle" / "rootfs" / "bin" / "tool").write_text("x")
    (image / "bundle" / "config.json").write_text(json.dumps({"process": {"env": ["PATH=/bin"]}, "root": {},
                                                              "mounts": [{"destination": "/dev/shm", "type": "tmpfs"}]}))
    step = container("slurm_oci", f"cluster.container.image={image}", component="trainer", job=tmp_path / "job")
    bundle = write_bundle(step, tmp_path / "job")
    linked = bundle / "rootfs" / "bin" / "tool"
    assert os.stat(linked).st_ino == os.stat(image / "bundle" / "rootfs" / "bin" / "tool").st_ino
    spec = json.loads((bundle / "config.json").read_text())
    assert spec["root"] == {"path": "rootfs", "readonly": True} and spec["process"]["cwd"] == str(tmp_path)
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert mounts["/dev/shm"]["source"] == "/dev/shm" and mounts["/models"]["options"] == ["rbind", "ro"]
    assert mounts["/tmp"]["type"] == "tmpfs" and str(tmp_path) in mounts   # the submit folder, the job folder inside it
    if Path("/dev/shm").stat().st_dev != tmp_path.stat().st_dev:   # another file system: no hard links
        elsewhere = Path("/dev/shm") / f"dockyard-test-{os.getpid()}"
        try:
            with pytest.raises(ContainerError, match="must be on the image's file system"):
                write_bundle(step, elsewhere)
        finally:
            import shutil

            shutil.rmtree(elsewhere, ignore_errors=True)


def test_an_image_folder_that_cannot_be_made_is_named_without_a_traceback(tmp_path, capsys):
    from dockyard.cli import main

    (tmp_path / "file").write_text("")
    assert main(["image", "build", "--output", str(tmp_path / "file" / "images")]) == 1
    err = capsys.readouterr().err
    assert f"--output {tmp_path / 'file' / 'images'}: cannot make the image folder there" in err and "Traceback" not in err


def test_a_charliecloud_root_links_the_image_and_makes_the_mount_targets_without_leaving_it(tmp_path, monkeypatch):
    import os

    from dockyard.launch.containers import ContainerError, image_problem, write_charliecloud_root

    monkeypatch.setenv("DOCKYARD_SUBMIT_DIR", str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    image = tmp_path / "image"
    rootfs = image / "bundle" / "rootfs"
    for folder in ("bin", "etc", "var"):
        (rootfs / folder).mkdir(parents=True)
    (rootfs / "bin" / "tool").write_text("x")
    (image / "bundle" / "config.json").write_text(json.dumps({"process": {"env": [
        "PATH=/opt/v/bin:/usr/bin", "HF_HUB_OFFLINE=1", "DOCKYARD_IMAGE_ENV=HF_HUB_OFFLINE"]}}))
    (tmp_path / "token").write_text("secret")
    assert image_problem("charliecloud", str(image)) is None
    step = container("charliecloud", f"cluster.container.image={image}", "cluster.container.mounts="
                     f"[{tmp_path / 'token'}:/etc/token:ro,{tmp_path}:/data/in]", component="trainer", job=tmp_path / "job")
    root = write_charliecloud_root(step, tmp_path / "job")
    assert root == tmp_path / "job" / "charliecloud" / "trainer" and step.root == str(root)
    assert os.stat(root / "bin" / "tool").st_ino == os.stat(rootfs / "bin" / "tool").st_ino
    assert (root / "etc" / "token").is_file() and (root / "data" / "in").is_dir()   # a file's target is a file
    assert (root / str(tmp_path / "work").lstrip("/")).is_dir()                      # the submit folder's
    assert not (rootfs / "data").exists()                                            # the image is untouched
    # ch-run --set-env takes the image's ENV from /ch/environment: written from the bundle's, PATH left out
    assert (root / "ch" / "environment").read_text() == "HF_HUB_OFFLINE=1\nDOCKYARD_IMAGE_ENV=HF_HUB_OFFLINE\n"
    # a target through a link of the image's would be made wherever the link points: refused
    (rootfs / "var" / "run").symlink_to("/run")
    step = container("charliecloud", f"cluster.container.image={image}", f"cluster.container.mounts=[{tmp_path}:/var/run/x]",
                     component="trainer", job=tmp_path / "job")
    with pytest.raises(ContainerError, match="/var/run is a link in the image"):
        write_charliecloud_root(step, tmp_path / "job")
    assert "is neither an image folder" in image_problem("charliecloud", str(tmp_path / "work"))
