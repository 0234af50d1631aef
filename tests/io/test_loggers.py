"""The experiment trackers write data their own tools read back: W&B's offline run (its record
definitions), MLflow's store (its client), SwanLab's offline log (its own reader). A tracker that
cannot start says which setting to change."""

import json
from pathlib import Path

import pytest

from dockyard.config.schema.logger import LoggerConfig
from dockyard.io.loggers import LoggerStartError, WandbWriter, scalar_summary, start_trackers


def wandb_history(log_dir: Path) -> list[dict]:
    """Each history record of the offline run under log_dir as {key: value}. The .wandb file is a
    leveldb-style log (32 KiB blocks, 7-byte record headers) of W&B's protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (log_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data, pos, block, pending, rows = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):   # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def swanlab_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = (log_dir / "swanlab").glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(path)
    out: dict[str, dict[int, float]] = {}
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "scalar":
            out.setdefault(record.scalar.key, {})[record.scalar.step] = record.scalar.value.number
    reader.close()
    return out


def all_four(tmp_path) -> LoggerConfig:
    return LoggerConfig(log_dir=str(tmp_path), wandb_enabled=True, mlflow_enabled=True, swanlab_enabled=True,
                        wandb={"mode": "offline", "project": "dockyard-test"}, swanlab={"mode": "offline"},
                        mlflow={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "experiment_name": "tests"})


def test_a_list_metric_is_summarised_for_scalar_only_trackers():
    summary = scalar_summary({"loss": 0.5, "lag": [1, 2, 3, 10], "empty": [], "note": "text"})
    assert summary == {"loss": 0.5, "lag/mean": 4.0, "lag/p50": 2.5, "lag/p90": pytest.approx(7.9),
                       "lag/max": 10.0}


def test_the_per_worker_timeline_is_merged_before_it_is_summarised():
    summary = scalar_summary({"gen/request_seconds/replica0": [1.0, 3.0], "gen/request_seconds/replica1": [2.0]})
    assert summary == {"gen/request_seconds/mean": 2.0, "gen/request_seconds/p50": 2.0,
                       "gen/request_seconds/p90": pytest.approx(2.8), "gen/request_seconds/max": 3.0}


def test_every_tracker_writes_what_its_own_reader_reads_back(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = start_trackers(all_four(tmp_path), tmp_path, "grpo_test", {"grpo": {"max_num_steps": 3}})
    assert [type(t).__name__ for t in trackers] == ["WandbWriter", "MlflowWriter", "SwanlabWriter"]
    for step in (1, 2, 3):
        for tracker in trackers:
            tracker.log(step, {"reward/mean": step / 10, "async/lags": [step, step + 2]})
    for tracker in trackers:
        tracker.close()

    history = wandb_history(tmp_path)
    assert [row["reward/mean"] for row in history] == [0.1, 0.2, 0.3]
    assert history[0]["async/lags/_type"] == "histogram"   # a list goes whole to W&B
    assert sum(history[0]["async/lags/values"]) == 2

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = (tmp_path / "mlflow_run_id").read_text()
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "reward/mean")] == [(1, 0.1), (2, 0.2),
                                                                                             (3, 0.3)]
    assert [m.value for m in client.get_metric_history(run_id, "async/lags/max")] == [3.0, 4.0, 5.0]
    assert client.get_run(run_id).data.params["grpo.max_num_steps"] == "3"
    assert client.get_run(run_id).info.status == "FINISHED"

    scalars = swanlab_scalars(tmp_path)
    assert scalars["reward/mean"] == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})
    assert scalars["async/lags/mean"] == pytest.approx({1: 2.0, 2: 3.0, 3: 4.0})


def test_a_requeued_run_continues_the_same_mlflow_run(tmp_path):
    config = LoggerConfig(log_dir=str(tmp_path), mlflow_enabled=True,
                          mlflow={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"})
    first = start_trackers(config, tmp_path, "run", {})[0]
    first.log(1, {"x": 1.0})
    first.close()
    again = start_trackers(config, tmp_path, "run", {})[0]
    again.log(2, {"x": 2.0})
    again.close()
    assert again.run_id == first.run_id
    assert [m.step for m in again.client.get_metric_history(again.run_id, "x")] == [1, 2]


def test_a_tracker_that_cannot_start_names_its_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))   # no ~/.netrc login either
    with pytest.raises(LoggerStartError, match="logger.wandb.mode is online but no W&B credentials"):
        WandbWriter(LoggerConfig(log_dir=str(tmp_path), wandb_enabled=True), tmp_path, "run", {})
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    with pytest.raises(LoggerStartError, match="logger.swanlab.mode is online but SWANLAB_API_KEY is not set"):
        start_trackers(LoggerConfig(log_dir=str(tmp_path), swanlab_enabled=True), tmp_path, "run", {})
    (tmp_path / "broken.db").write_bytes(b"not a database" * 100)
    bad = LoggerConfig(log_dir=str(tmp_path), mlflow_enabled=True,
                       mlflow={"tracking_uri": f"sqlite:///{tmp_path}/broken.db"})
    with pytest.raises(LoggerStartError, match="logger.mlflow.tracking_uri: MLflow at .* did not start"):
        start_trackers(bad, tmp_path, "run", {})


def test_the_trackers_own_variables_count_where_the_config_leaves_a_setting_unset(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))   # no ~/.netrc login either
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "from-the-environment")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    (tmp_path / "wandb-dir").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    config = LoggerConfig(log_dir=str(tmp_path), wandb_enabled=True, mlflow_enabled=True, swanlab_enabled=True)
    trackers = start_trackers(config, tmp_path, "run", {})   # no credentials: the variables made them offline
    wandb, mlflow, _ = trackers
    assert wandb.run.project == "from-the-environment"
    assert list((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*"))
    for tracker in trackers:
        tracker.log(1, {"x": 1.0})
        tracker.close()
    assert MlflowClient(f"sqlite:///{tmp_path}/env.db").get_run(mlflow.run_id).info.status == "FINISHED"
    # a setting in the config wins over its variable
    with pytest.raises(LoggerStartError, match="logger.wandb.mode is online but no W&B credentials"):
        start_trackers(LoggerConfig(log_dir=str(tmp_path), wandb_enabled=True, wandb={"mode": "online"}), tmp_path,
                       "run", {})
    monkeypatch.setenv("WANDB_MODE", "sideways")
    with pytest.raises(LoggerStartError, match="logger.wandb.mode: unset, and WANDB_MODE='sideways' is not one of"):
        start_trackers(LoggerConfig(log_dir=str(tmp_path), wandb_enabled=True), tmp_path, "run", {})
    # the preflight's rule takes MLFLOW_TRACKING_URI for the unset field
    from dockyard.config import load_config

    overrides = ["models_dir=models", "logger.mlflow_enabled=true"]
    assert load_config("grpo_tiny.yaml", overrides).config.logger.mlflow.tracking_uri == ""
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    from dockyard.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"logger.mlflow.tracking_uri: required .* \(or set MLFLOW_TRACKING_URI\)"):
        load_config("grpo_tiny.yaml", overrides)
