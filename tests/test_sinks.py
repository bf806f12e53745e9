"""W&B and MLflow sinks against the real libraries in their local modes, read back from what they wrote."""

import builtins
import json
import math
import struct
import time

import pytest
from google.protobuf.message import DecodeError

from turnrl.config import load_config
from turnrl.monitor.sinks import MetricLogger, MlflowSink, WandbSink


def _wandb_records(path):
    """Records of a ``.wandb`` file: W&B's LevelDB-style log (7-byte header, 32 KiB blocks, chunked records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if n == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST chunk
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec
            buf = b""


def _wandb_history(run_dir):
    """History rows of the run's ``.wandb`` file. ``run.finish()`` can return before W&B's service process has
    written the file out, so wait (up to 20 s) until it ends with the run's exit record."""
    files = list((run_dir / "wandb").glob("*run-*/run-*.wandb"))
    assert len(files) == 1, files
    deadline = time.monotonic() + 20
    while True:
        try:
            records = list(_wandb_records(files[0]))
        except (AssertionError, struct.error, DecodeError):  # caught mid-write
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_wandb_offline_run_holds_the_logged_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run_dir = tmp_path / "run-a"
    run_dir.mkdir()
    logger = MetricLogger([WandbSink(run_dir, "turnrl-test", {"algo": {"estimator": "grpo_turn"}})])
    logger.log(1, {"rollout/success_rate": 0.25, "train/loss": 1.5})
    logger.log(2, {"rollout/success_rate": 0.75, "train/kl": 0.01})
    logger.close()
    rows = _wandb_history(run_dir)
    assert [(r["_step"], r["rollout/success_rate"]) for r in rows] == [(1, 0.25), (2, 0.75)]
    assert rows[0]["train/loss"] == 1.5 and rows[1]["train/kl"] == 0.01
    assert (run_dir / "wandb_run_id").read_text() in str(next((run_dir / "wandb").glob("*run-*")))


def test_mlflow_run_holds_the_logged_steps_and_resume_appends(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    # MLflow 3 keeps the file store in maintenance mode behind this switch; it is the store that needs no
    # database packages, and the sink code is the same for every backend.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    run_dir = tmp_path / "run-b"
    run_dir.mkdir()
    sink = MlflowSink(run_dir, uri, "turnrl-test", {"algo": {"estimator": "grpo_turn"}, "train": {"lr": 1e-5}})
    sink.write(1, {"rollout/success_rate": 0.25, "train/loss": float("nan")})
    sink.close()
    again = MlflowSink(run_dir, uri, "turnrl-test")  # as `turnrl train --resume` does
    again.write(2, {"rollout/success_rate": 0.5, "train/loss": 2.0})
    again.close()
    assert again.run_id == sink.run_id

    client = MlflowClient(uri)
    run = client.get_run(sink.run_id)
    assert run.info.run_name == "run-b" and run.info.status == "FINISHED"
    assert run.data.params["algo.estimator"] == "grpo_turn" and float(run.data.params["train.lr"]) == 1e-5
    hist = [(m.step, m.value) for m in client.get_metric_history(sink.run_id, "rollout.success_rate")]
    assert sorted(hist) == [(1, 0.25), (2, 0.5)]  # the file store's names: "/" -> "." (see MlflowSink)
    loss = client.get_metric_history(sink.run_id, "train.loss")
    assert [(m.step, m.value) for m in loss] == [(2, 2.0)]  # the NaN was skipped, not logged
    assert not any(math.isnan(m.value) for m in loss)


@pytest.mark.parametrize("sink, package, extra", [(WandbSink, "wandb", "wandb"), (MlflowSink, "mlflow", "mlflow")])
def test_a_missing_tracker_names_the_extra_to_install(tmp_path, monkeypatch, sink, package, extra):
    real_import = builtins.__import__

    def no_tracker(name, *args, **kwargs):
        if name == package or name.startswith(package + "."):
            raise ImportError(f"No module named {package!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tracker)
    args = (tmp_path, "p") if sink is WandbSink else (tmp_path, "", "e")
    with pytest.raises(ImportError, match=rf"pip install 'turnrl\[{extra}\]'"):
        sink(*args)


def test_log_config_switches_default_off():
    cfg = load_config(None, ["log.wandb=true", "log.mlflow_tracking_uri=http://tracker:5000"])
    assert cfg.log.wandb and not cfg.log.mlflow and cfg.log.mlflow_tracking_uri == "http://tracker:5000"
    assert load_config(None, []).log.wandb is False


def test_training_with_both_trackers_on_logs_every_step_to_each(tmp_path, tokenizer, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tests.test_train import TINY
    from turnrl.models import tiny_model
    from turnrl.build import build
    from turnrl.loop import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    cfg = load_config(None, TINY + [f"log.run_dir={tmp_path}", "log.name=tracked", "log.wandb=true", "log.mlflow=true",
                                    f"log.mlflow_tracking_uri={uri}", "log.checkpoint_every=0"])
    run_dir = train(cfg, components=build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer))
    steps = [r["_step"] for r in _wandb_history(run_dir) if "train/loss" in r]
    assert steps == [1, 2]
    run_id = (run_dir / "mlflow_run_id").read_text()
    hist = MlflowClient(uri).get_metric_history(run_id, "eval.success_rate")
    assert MlflowClient(uri).get_metric_history(run_id, "eval.reward.outcome")  # beside eval.reward
    assert sorted(m.step for m in hist) == [0, 1, 2]
    assert MlflowClient(uri).get_run(run_id).data.params["env.id"] == "parity-v0"
