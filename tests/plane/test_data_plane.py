"""The data plane end to end on this machine: `dockyard run` (2 trainer ranks and the broker it starts,
a real redis-server) with real `dockyard rollout-worker` processes, each with its own embedded engine.
Workers join and leave mid-run, the trainer is killed between reading groups and checkpointing them,
the broker is killed and started again: every group is accounted for and none is trained twice."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed "
                                "(tools/install.sh installs it)")

CONFIG = "grpo_tiny_plane.yaml"
ACCOUNTING = re.compile(r"produced (\d+) = trained (\d+) \+ stale (\d+) \+ duplicate (\d+) \+ in flight (\d+); "
                        r"lost (-?\d+); workers joined (\d+), left (\d+)")


def _start(workdir: Path, model: Path, command: str, *args: str) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "dockyard.cli", command, "--config", CONFIG,
                             f"models_dir={model.parent}", *args], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(process: subprocess.Popen, timeout: float = 300, *beside: subprocess.Popen) -> str:
    """Its output once it exits; past the timeout, a failure that shows what it and the processes
    beside it (the workers) said."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as late:
        said = []
        for other in (process, *beside):
            if other.poll() is None:
                os.killpg(other.pid, signal.SIGKILL)
            text = late.output if other is process else other.communicate(timeout=30)[0]
            said.append(f"--- {' '.join(other.args[3:])[:160]}:\n{(text.decode() if isinstance(text, bytes) else text or '')[-3000:]}")
        raise AssertionError(f"not finished after {timeout:.0f} s\n" + "\n".join(said)) from None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return output


def _kill_left(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def _steps(workdir: Path) -> list[dict]:
    path = workdir / "runs" / "grpo_tiny_plane" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _wait(condition, what: str, timeout: float = 180, trainer: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if trainer is not None and trainer.poll() is not None:
            raise AssertionError(f"the trainer exited ({trainer.returncode}) while waiting for {what}:\n"
                                 + trainer.stdout.read()[-3000:])
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.2)


def _accounting(output: str) -> dict[str, int]:
    found = ACCOUNTING.findall(output)
    assert found, output[-3000:]
    names = ("produced", "trained", "stale", "duplicate", "in_flight", "lost", "joined", "left")
    return dict(zip(names, map(int, found[-1])))


def _rows(step: dict) -> list[int]:
    return step["async/prompt_rows"]


def _a_stranger_cannot_write_to_the_broker(workdir: Path) -> None:
    """The started broker listens on every interface: a client without the run folder's password (a
    process of another user on the cluster, a policy's sandbox with network) cannot push a group."""
    import redis

    plane = workdir / "runs" / "grpo_tiny_plane" / "checkpoints" / "data_plane"
    host, port = (plane / "broker.address").read_text().strip().rsplit(":", 1)
    stranger = redis.Redis(host=host, port=int(port), socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        stranger.xadd("dockyard:grpo_tiny_plane:groups", {"n": 1, "row": 0, "version": 0, "trajectories": "[]"})
    assert oct((plane / "broker.secret").stat().st_mode & 0o777) == "0o600"


def test_workers_join_and_leave_while_the_trainer_steps_and_every_group_is_accounted_for(tiny_model, tmp_path):
    # rows repeat from the second epoch on: a dataset no run of this test gets through (64 steps did, of 256 rows)
    trainer = _start(tmp_path, tiny_model, "run", "grpo.max_num_steps=1000", "data.datasets.0.generator.size=4096")
    workers = {name: _start(tmp_path, tiny_model, "rollout-worker", "--worker-id", name) for name in ("first", "second")}
    try:
        _wait(lambda: any(m["plane/workers"] == 2 for m in _steps(tmp_path)), "a step with both workers",
              trainer=trainer)
        _a_stranger_cannot_write_to_the_broker(tmp_path)
        os.killpg(workers["first"].pid, signal.SIGTERM)   # what scancel and a preemption send
        workers["third"] = _start(tmp_path, tiny_model, "rollout-worker", "--worker-id", "third")
        first_output = _finish(workers["first"], 120)
        at_leave = len(_steps(tmp_path))
        _wait(lambda: any(m["plane/workers_joined"] == 3 and m["plane/workers"] == 2 for m in _steps(tmp_path)),
              "a step with the second and third workers")
        joined_at = len(_steps(tmp_path))
        _wait(lambda: len(_steps(tmp_path)) >= joined_at + 3, "three more steps")
        os.killpg(trainer.pid, signal.SIGINT)   # Ctrl-C: the trainer saves at its next safe point and stops
        output = _finish(trainer)
        for name in ("second", "third"):
            os.killpg(workers[name].pid, signal.SIGTERM)
        others = {name: _finish(workers[name], 120) for name in ("second", "third")}
    finally:
        _kill_left(trainer, *workers.values())
    assert trainer.returncode == 128 + signal.SIGINT, output[-3000:]
    for name, text in {"first": first_output, **others}.items():
        assert workers[name].returncode == 0 and "left after" in text, (name, text[-2000:])
    assert not re.search(r"left after 0 group", others["third"]), others["third"][-2000:]
    history = _steps(tmp_path)
    steps = len(history)
    assert [m["step"] for m in history] == list(range(1, steps + 1)) and at_leave < steps
    assert all(m["plane/groups_per_s"] > 0 for m in history)
    rows = [row for m in history for row in _rows(m)]
    assert len(rows) == steps * 4 and len(set(rows)) == len(rows)   # no prompt trained twice
    assert all(lag <= 1 for m in history for lag in m["async/lag"])   # the staleness bound holds
    count = _accounting(output)
    assert count["lost"] == 0 and count["trained"] == steps * 4, count
    assert count["joined"] == 3 and count["left"] == 1, count
    # version folders no live worker serves are removed (those a lagging worker still serves stay); the last stays
    weights = tmp_path / "runs" / "grpo_tiny_plane" / "checkpoints" / "data_plane" / "weights"
    assert (weights / f"v{steps}" / "model.safetensors").is_file()
    kept = sorted(int(folder.name[1:]) for folder in weights.glob("v*"))
    assert kept == list(range(kept[0], steps + 1)) and kept[0] > 2, kept


def test_a_trainer_killed_between_reading_and_checkpointing_trains_the_same_groups_again(tiny_model, tmp_path):
    overrides = ("checkpointing.save_period=2",)
    trainer = _start(tmp_path, tiny_model, "run", "grpo.max_num_steps=1000", *overrides)
    worker = _start(tmp_path, tiny_model, "rollout-worker", "--worker-id", "steady")
    try:
        _wait(lambda: len(_steps(tmp_path)) >= 3, "three steps", trainer=trainer)
        processes = json.loads((tmp_path / "runs" / "grpo_tiny_plane" / "logs" / "processes.json").read_text())
        rank0 = processes["trainer rank 0"]["pid"]
        pointer = tmp_path / "runs" / "grpo_tiny_plane" / "checkpoints" / "latest_checkpointed_iteration.txt"
        while True:   # frozen at a moment when a trained step is not checkpointed yet, then killed
            os.kill(rank0, signal.SIGSTOP)
            time.sleep(0.2)
            logged, checkpoint = len(_steps(tmp_path)), int(pointer.read_text())
            if checkpoint < logged:
                break
            os.kill(rank0, signal.SIGCONT)
            _wait(lambda: len(_steps(tmp_path)) > logged, "one more step", trainer=trainer)
        os.kill(rank0, signal.SIGKILL)
        killed = _finish(trainer, 120)
        first = _steps(tmp_path)
        assert trainer.returncode != 0, killed[-2000:]
        assert checkpoint % 2 == 0 and checkpoint < len(first) and int(pointer.read_text()) == checkpoint
        (tmp_path / "runs" / "grpo_tiny_plane" / "logs" / "metrics.jsonl").rename(tmp_path / "first.jsonl")
        again = _start(tmp_path, tiny_model, "run", f"grpo.max_num_steps={checkpoint + 3}", *overrides)
        # a worker started with other sampling settings than the run's is refused, naming them
        other = _start(tmp_path, tiny_model, "rollout-worker", "policy.generation.max_new_tokens=8")
        refused = _finish(other, 120)
        output = _finish(again, 300, worker)
        worker_output = _finish(worker, 60)
    finally:
        _kill_left(trainer, worker)
    assert again.returncode == 0, output[-3000:]
    assert other.returncode == 3, refused[-2000:]
    assert ("its config samples differently from the run's (start it with the run's config, <log_dir>/config.yaml)"
            ": policy.generation.max_new_tokens (the run: 16, here: 8)") in refused
    assert "read but not checkpointed before the stop are trained again first" in output
    assert "does not answer" in worker_output and "answers again" in worker_output, worker_output[-2000:]
    second = _steps(tmp_path)
    assert second[0]["step"] == checkpoint + 1
    # the first step after the checkpoint trains exactly the groups the killed trainer had read for it
    assert sorted(_rows(second[0])) == sorted(_rows(first[checkpoint]))
    trained = [row for m in first[:checkpoint] + second for row in _rows(m)]
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    count = _accounting(output)
    assert count["lost"] == 0 and count["trained"] == (checkpoint + 3) * 4, count


def test_the_broker_killed_mid_run_pauses_the_run_which_goes_on_when_it_is_back(tiny_model, tmp_path):
    from dockyard.distributed import free_port

    port, folder = free_port(), tmp_path / "broker"
    folder.mkdir()
    server = ["redis-server", "--port", str(port), "--dir", str(folder), "--appendonly", "yes",
              "--appendfsync", "always", "--save", ""]
    broker = subprocess.Popen(server, stdout=subprocess.DEVNULL)
    plane = ("data_plane.start=false", f"data_plane.address=127.0.0.1:{port}")
    trainer = _start(tmp_path, tiny_model, "run", "grpo.max_num_steps=6", *plane)
    worker = _start(tmp_path, tiny_model, "rollout-worker", *plane)
    said: dict[str, list[str]] = {"trainer": [], "worker": []}
    try:
        _wait(lambda: len(_steps(tmp_path)) >= 2, "two steps", trainer=trainer)
        for name, process in (("trainer", trainer), ("worker", worker)):   # read as they go: the outage is
            threading.Thread(target=lambda p=process, lines=said[name]: lines.extend(p.stdout), daemon=True).start()
        broker.kill()
        broker.wait()
        # down until a side has met the outage: a fixed pause can fall inside one long step on a loaded machine
        _wait(lambda: any("does not answer" in line for lines in said.values() for line in lines),
              "the trainer or the worker to meet the broker's outage", timeout=240)
        broker = subprocess.Popen(server, stdout=subprocess.DEVNULL)
        trainer.wait(timeout=300)
        worker.wait(timeout=60)
        time.sleep(0.5)   # the readers take the last lines
        output, worker_output = "".join(said["trainer"]), "".join(said["worker"])
    finally:
        _kill_left(trainer, worker)
        broker.kill()
    assert trainer.returncode == 0, output[-3000:]
    assert f"the broker at 127.0.0.1:{port} does not answer" in output + worker_output
    assert "answers again" in output + worker_output
    history = _steps(tmp_path)
    assert [m["step"] for m in history] == list(range(1, 7))
    rows = [row for m in history for row in _rows(m)]
    assert len(rows) == len(set(rows))
    assert _accounting(output)["lost"] == 0


def test_a_broker_client_setting_redis_does_not_take_is_refused_by_name_before_anything_starts(tiny_model, tmp_path,
                                                                                              capsys):
    from dockyard.cli import main as dockyard_main
    from dockyard.launch.submit import submit_main

    overrides = [f"models_dir={tiny_model.parent}", f"logger.log_dir={tmp_path}/logs",
                 f"checkpointing.checkpoint_dir={tmp_path}/checkpoints", "+data_plane.pasword=secret"]
    for command in ("run", "rollout-worker"):
        assert dockyard_main([command, "--config", CONFIG, *overrides]) == 2
        err = capsys.readouterr().err
        assert "data_plane.pasword: not a setting of the data plane nor a keyword of redis.Redis" in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "logs" / "config.yaml").exists() and not (tmp_path / "checkpoints").exists()
    assert submit_main(["--config", CONFIG, "--dry-run", "--rollout-workers", "2", *overrides]) == 2
    err = capsys.readouterr().err
    assert "data_plane.pasword: not a setting of the data plane" in err and "nothing was submitted" in err


def test_a_group_that_is_not_one_names_the_worker_it_came_from():
    from dockyard.data.datasets import Prompt
    from dockyard.plane.messages import BadMessage, decode_group

    prompt = Prompt("1+1", "2", {}, "arithmetic")
    with pytest.raises(BadMessage, match="group 1-0 from worker w7: not a group of trajectories"):
        decode_group('[{"sample": {"token_ids": [1], "prompt_length": 1}, "raw_reward": 1, "exec": "x"}]',
                     prompt, "group 1-0 from worker w7")


def test_a_group_with_screenshots_crosses_the_broker_as_json_and_comes_back_byte_for_byte():
    from dockyard.data.datasets import Prompt
    from dockyard.loop.rollouts import Group, Trajectory
    from dockyard.plane.messages import BadMessage, decode_group, encode_trajectories
    from dockyard.policy.samples import Sample

    prompt = Prompt("open a terminal", None, {}, "osworld")
    pictures = [b"\x89PNG\r\n\x1a\n" + bytes(range(256)), b"\x89PNG second"]
    group = Group(prompt, [Trajectory(Sample([1, 2, 3], 2, images=pictures), 1.0), Trajectory(Sample([1, 4], 1), 0.0)])
    text = encode_trajectories(group)
    back = decode_group(text, prompt, "group 0-0 from worker w1")
    assert [t.sample.images for t in back.trajectories] == [pictures, None]
    with pytest.raises(BadMessage, match="from worker w1: not a group"):
        decode_group(text.replace('"images": ["', '"images": ["%'), prompt, "group 0-0 from worker w1")


def test_a_prompt_whose_workers_keep_dying_silently_is_set_aside_and_named(tiny_model, tmp_path):
    """Three workers took the prompt and went away without a word (SIGKILL, a lost node: nothing acked,
    nothing handed back); the fourth sets it aside instead of dying of it in turn."""
    import redis

    from dockyard import registry
    from dockyard.config import load_config
    from dockyard.distributed import free_port
    from dockyard.generation.fleet import GeneratorFleet
    from dockyard.plane.broker import Broker
    from dockyard.plane.feed import PROMPTS, WORKERS, ensure_groups
    from dockyard.plane.worker import MAX_DELIVERIES, RolloutWorker

    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--dir", str(tmp_path), "--save", ""],
                              stdout=subprocess.DEVNULL)
    try:
        cfg = load_config(CONFIG, [f"models_dir={tiny_model.parent}", "data_plane.start=false",
                                   f"data_plane.address=127.0.0.1:{port}", "data_plane.claim_after_s=0.05",
                                   f"logger.log_dir={tmp_path}/logs"]).config
        _wait(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0,
              "redis-server")
        broker = Broker(cfg)
        ensure_groups(broker)
        plain = redis.Redis(port=port, decode_responses=True)
        plain.xadd(broker.key(PROMPTS), {"n": 7, "row": 41, "seed": 1, "prompt": "{}"})
        plain.hset(broker.key("outstanding"), 7, 41)
        plain.xreadgroup(WORKERS, "dead0", {broker.key(PROMPTS): ">"}, count=1)
        for index in range(1, MAX_DELIVERIES):
            time.sleep(0.1)
            plain.xautoclaim(broker.key(PROMPTS), WORKERS, f"dead{index}", min_idle_time=50, count=1)
        time.sleep(0.1)
        worker = RolloutWorker(cfg, "fourth", tmp_path)
        worker.broker = broker
        client = registry.build("generation_backend", "embedded", config=cfg).client("http://127.0.0.1:9", "unused")
        worker.fleet = GeneratorFleet([client])
        assert worker._take() == []
        assert plain.hgetall(broker.key("set_aside")) == {"7": "41"}
        assert not plain.hexists(broker.key("outstanding"), 7)   # the trainer no longer counts it as open
        assert plain.xlen(broker.key(PROMPTS)) == 0 and plain.hget(broker.key("counters"), "set_aside") == "1"
    finally:
        server.kill()


def test_a_version_published_again_by_a_resumed_trainer_is_loaded_again(tiny_model, tmp_path, capsys):
    """A trainer killed past its checkpoint had published versions that its resumed successor writes
    again from other weights, into the same folder: a worker that served the first must load the
    second (same version, same path), and one that loses the race to the rewrite reads again."""
    from safetensors.torch import load_file

    from dockyard.config import load_config
    from dockyard.distributed import free_port
    from dockyard.plane.broker import Broker
    from dockyard.plane.feed import ensure_groups
    from dockyard.plane.weights import FILE, WeightPublisher, announced
    from dockyard.plane.worker import RolloutWorker

    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--dir", str(tmp_path), "--save", ""],
                              stdout=subprocess.DEVNULL)
    worker = None
    try:
        cfg = load_config(CONFIG, [f"models_dir={tiny_model.parent}", "data_plane.start=false",
                                   f"data_plane.address=127.0.0.1:{port}", f"logger.log_dir={tmp_path}/logs",
                                   f"checkpointing.checkpoint_dir={tmp_path}/checkpoints"]).config
        _wait(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0,
              "redis-server")
        broker = Broker(cfg)
        ensure_groups(broker)
        weights = load_file(str(tiny_model / "model.safetensors"))
        killed_run = WeightPublisher(cfg, broker)
        killed_run.publish(weights, 3)
        first = announced(broker)
        (tmp_path / "worker").mkdir()
        worker = RolloutWorker(cfg, "steady", tmp_path / "worker")
        worker.broker = broker
        worker.fleet = worker.start_servers()
        assert worker._follow_weights() and worker.serving == first

        resumed_run = WeightPublisher(cfg, broker)
        other = {name: t + 0.01 for name, t in weights.items()}
        resumed_run.publish(other, 3)
        second = announced(broker)
        assert (second.version, second.path) == (first.version, first.path) and second != first
        assert worker._follow_weights() and worker.serving == second
        said = capsys.readouterr().err
        assert said.count("serving weights version 3") == 2, said
        served = load_file(str(Path(second.path) / FILE))
        assert all((served[name] == other[name]).all() for name in other)
        assert [p.name for p in resumed_run.root.iterdir()] == ["v3"]   # the first write is gone, not left aside

        # the announced folder vanishes under the load because the trainer moved on (pruned, rewritten):
        # the worker reads the news again instead of ending
        resumed_run.publish(weights, 4)
        load = worker.fleet.load_weights_from_disk

        def trainer_moves_on_during_the_load(path):
            shutil.rmtree(path)
            resumed_run.publish(other, 5)
            load(path)

        worker.fleet.load_weights_from_disk = trainer_moves_on_during_the_load
        assert worker._follow_weights() is False and worker.serving == second
        worker.fleet.load_weights_from_disk = load
        assert worker._follow_weights() and worker.serving == announced(broker) and worker.version == 5
        # the same failure with the announcement unchanged is the worker's own: it ends, naming the version
        shutil.rmtree(announced(broker).path)
        broker.redis.hset(broker.key("state"), "weights_publication", "rewritten")
        with pytest.raises(Exception, match="its servers cannot load weights version 5 from"):
            worker._follow_weights()
    finally:
        if worker is not None:
            worker._leave()
        server.kill()
