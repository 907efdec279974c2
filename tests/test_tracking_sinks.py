"""Tracking sinks, each read back with its own library: TensorBoard's EventAccumulator, MLflow's client, and the
offline W&B run file parsed into wandb's own protobuf records. No Ray: the run log is driven directly (the loop's
use of it is checked by the viewer's end-to-end run in test_view_browser.py)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.tracking import open_run_log, read_metrics
from posttrain.tracking.redaction import REDACTED, redact, secret_env_values

SECRET = "sk-test-9f8e7d6c5b4a39281706"  # an OPENAI_API_KEY set while the sinks write
URL_PASSWORD = "hunter2-cluster-pw"
# What the fake run logs: eval at 0, three steps, eval at 3 (the loop's order), checkpoints at 2 and 3.
RECORDS = [
    {"step": 0, "eval/heldout_accuracy": 0.125},
    {"step": 1, "reward_mean": 0.25, "kl": 0.0, "entropy": None, "time/generate": 0.5},
    {"step": 2, "reward_mean": 0.375, "kl": 0.001, "entropy": 1.5, "time/generate": 0.25},
    {"step": 3, "reward_mean": 0.5, "kl": 0.002, "entropy": 1.25, "time/generate": 0.125},
    {"step": 3, "eval/heldout_accuracy": 0.25},
]


def _cfg(runs_dir: Path, *extra: str):
    return load_config(None, [
        "name=tracked", f"runs_dir={runs_dir}", "logging.sinks=[jsonl,tensorboard,mlflow,wandb]",
        # Secrets reaching the config by accident: a password in a URL, and the API key's value in a path.
        f"ray.address=ray://admin:{URL_PASSWORD}@127.0.0.1:10001", "task.name=dataset",
        f"task.path=/data/{SECRET}/rows.jsonl", *extra,
    ])


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    cfg = _cfg(runs)
    cfg.run_dir.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", SECRET)
        log = open_run_log(cfg, cfg.run_dir)
        for r in RECORDS:
            log.write(r)
            if r["step"] in (2, 3) and "reward_mean" in r:
                log.log_checkpoint(r["step"], cfg.run_dir / "checkpoints" / f"step_{r['step']:06d}")
        log.close()
    return cfg


def test_jsonl_is_always_written(tracked_run):
    assert read_metrics(tracked_run.run_dir) == RECORDS


def test_tensorboard_events_read_back(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked_run.run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    reward = [(e.step, e.value) for e in acc.Scalars("reward_mean")]
    assert reward == [(1, 0.25), (2, 0.375), (3, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/heldout_accuracy")] == [(0, 0.125), (3, 0.25)]
    assert [e.step for e in acc.Scalars("entropy")] == [2, 3]  # None at step 1 is not logged as a number
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}
    config_text = texts["config/text_summary"][0][1]
    assert "kl_coef: 0.02" in config_text and REDACTED in config_text
    assert [s for s, _ in texts["checkpoint/text_summary"]] == [2, 3]
    assert texts["checkpoint/text_summary"][-1][1].endswith("checkpoints/step_000003")


def test_mlflow_store_reads_back(tracked_run):
    from mlflow.tracking import MlflowClient

    ids = json.loads((tracked_run.run_dir / "tracking.json").read_text())
    client = MlflowClient(f"sqlite:///{tracked_run.run_dir / 'mlflow.db'}")
    run = client.get_run(ids["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward_mean"))
    assert history == [(1, 0.25), (2, 0.375), (3, 0.5)]
    evals = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/heldout_accuracy"))
    assert evals == [(0, 0.125), (3, 0.25)]
    assert run.data.params["algorithm.kl_coef"] == "0.02" and run.data.params["train.steps"] == "400"
    assert run.data.params["ray.address"] == f"ray://admin:{REDACTED}@127.0.0.1:10001"
    assert run.data.tags["checkpoint.latest"].endswith("checkpoints/step_000003")
    assert run.data.tags["checkpoint.step_000002"].endswith("checkpoints/step_000002")
    # the config file artifact lives under the run directory too
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert tracked_run.run_dir.resolve() in artifacts.parents and (artifacts / "config.yaml").exists()


# ------------------------------------------------------------------ W&B offline run file
# A .wandb file is a leveldb-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of
# chunks (crc32 of type+data, uint16 length, uint8 type: 1 full, 2 first, 3 middle, 4 last) holding wandb's own
# protobuf `Record` messages. W&B ships no Python reader any more (its reader is in the Go core), so we parse the
# framing here and decode every record with wandb's protobuf classes, checking each chunk's crc.
_BLOCK, _HDR = 32768, 7


def read_wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:7] == b":W&B\xe1\xbe\x00", "not a W&B run file"
    records, pending, pos = [], b"", 7
    while pos + _HDR <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HDR:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HDR])
        chunk = data[pos + _HDR:pos + _HDR + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad crc at byte {pos}"
        pos += _HDR + length
        pending += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


def test_wandb_offline_run_reads_back(tracked_run):
    run_dirs = list((tracked_run.run_dir / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1, "W&B must run offline by default: nothing synced, one offline run directory"
    ids = json.loads((tracked_run.run_dir / "tracking.json").read_text())
    records = read_wandb_records(run_dirs[0] / f"run-{ids['wandb_run_id']}.wandb")
    kinds = [r.WhichOneof("record_type") for r in records]
    run = records[kinds.index("run")].run
    assert run.display_name == "tracked" and run.project == "posttrain"
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["algorithm"]["kl_coef"] == 0.02
    assert config["ray"]["address"] == f"ray://admin:{REDACTED}@127.0.0.1:10001"
    history = [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in records if r.HasField("history")]
    assert [(h["_step"], h["reward_mean"]) for h in history if "reward_mean" in h] == [(1, 0.25), (2, 0.375), (3, 0.5)]
    assert [(h["_step"], h["eval/heldout_accuracy"]) for h in history if "eval/heldout_accuracy" in h] == [(0, 0.125), (3, 0.25)]
    summary = {}
    for r in records:
        if r.HasField("summary"):
            summary.update({_key(u): json.loads(u.value_json) for u in r.summary.update})
    assert summary["checkpoint/latest"].endswith("checkpoints/step_000003")
    assert summary["checkpoint/step_000002"].endswith("checkpoints/step_000002")
    assert records[-1].HasField("exit") and records[-1].exit.exit_code == 0


def test_no_sink_wrote_a_secret(tracked_run):
    files = [p for p in tracked_run.run_dir.rglob("*") if p.is_file()]
    assert len(files) > 5
    for p in files:
        data = p.read_bytes()
        assert SECRET.encode() not in data, f"{p} holds the API key"
        assert URL_PASSWORD.encode() not in data, f"{p} holds the URL password"


def test_resume_continues_the_same_tracked_runs_and_a_failure_is_recorded(tracked_run):
    from mlflow.tracking import MlflowClient

    ids = json.loads((tracked_run.run_dir / "tracking.json").read_text())
    cfg = tracked_run.model_copy(update={"logging": tracked_run.logging.model_copy(update={"sinks": ["jsonl", "mlflow"]})})
    with pytest.raises(RuntimeError):
        log = open_run_log(cfg, cfg.run_dir, resume_from_step=2)
        try:
            log.write({"step": 3, "reward_mean": 0.625})
            raise RuntimeError("the run died")
        finally:
            log.close()
    assert json.loads((cfg.run_dir / "tracking.json").read_text())["mlflow_run_id"] == ids["mlflow_run_id"]
    client = MlflowClient(f"sqlite:///{cfg.run_dir / 'mlflow.db'}")
    assert client.get_run(ids["mlflow_run_id"]).info.status == "FAILED"
    values = [m.value for m in client.get_metric_history(ids["mlflow_run_id"], "reward_mean") if m.step == 3]
    assert 0.625 in values
    # metrics.jsonl dropped the lines after step 2 and has the resumed step 3
    assert read_metrics(cfg.run_dir)[-1] == {"step": 3, "reward_mean": 0.625}


def test_redaction_of_keys_urls_and_env_values():
    env = {"OPENAI_API_KEY": SECRET, "HF_TOKEN": "hf_abcdefghijkl", "HOME": "/root", "SHORT_TOKEN": "abc"}
    values = secret_env_values(env)
    assert values == [SECRET, "hf_abcdefghijkl"]  # longest first; HOME is not a secret, "abc" too short to scrub
    cfg = {"wandb_api_key": "x" * 10, "db": {"password": "pw", "url": "postgresql://u:pw@db:5432/x"},
           "path": f"/keys/{SECRET}", "list": ["hf_abcdefghijkl", 3], "empty_token": None, "lr": 0.1}
    assert redact(cfg, values) == {
        "wandb_api_key": REDACTED, "db": {"password": REDACTED, "url": f"postgresql://u:{REDACTED}@db:5432/x"},
        "path": f"/keys/{REDACTED}", "list": [REDACTED, 3], "empty_token": None, "lr": 0.1,
    }


def test_unknown_sink_is_a_config_error():
    with pytest.raises(PosttrainError, match="logging.sinks"):
        load_config(None, ["logging.sinks=[jsonl,comet]"])
