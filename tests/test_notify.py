"""Webhook notifications (ops.notify) against a real HTTP server on 127.0.0.1 that each test starts: both body
formats, a server that is down, one that is slow, redaction of secrets, the config's bad inputs, and the hooks in
the alarms, the in-loop gate and the run's failure path. No mocks: every body crosses a real socket (the server is
conftest.py's Webhook)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from posttrain.config import load_config
from posttrain.errors import PosttrainError
from posttrain.tracking.notify import Notifier


def _cfg(tmp_path, targets: str, *extra: str):
    return load_config(None, ["name=r1", f"runs_dir={tmp_path}", f"ops.notify=[{targets}]", *extra])


def _records(cfg) -> list[dict]:
    return [json.loads(line) for line in (cfg.run_dir / "notifications.jsonl").read_text().splitlines()]


def test_both_formats_arrive_with_their_bodies_and_are_recorded(tmp_path, webhook):
    cfg = _cfg(tmp_path, f"{{url: '{webhook.url}/slack', format: slack}}, "
                         f"{{url: '{webhook.url}/generic', events: [run_finished]}}")
    assert [t.format for t in cfg.ops.notify] == ["slack", "generic"]  # unset: generic (host is not Slack's)
    n = Notifier.from_config(cfg, environ={})
    n.emit("run_started", step=0, steps=4)  # the generic target does not want this one
    n.emit("run_finished", steps=4, heldout_before=0.125, heldout_after=0.25, wall_s=63.2,
           final_checkpoint="runs/r1/checkpoints/step_000004")
    n.close()
    got = {(path, b.get("event") or b["text"].split(": ")[1].split(" ·")[0]): b for path, b in webhook.received}
    assert sorted(got) == [("/generic", "run_finished"), ("/slack", "run_finished"), ("/slack", "run_started")]
    assert got["/slack", "run_finished"] == {"text": "posttrain run r1: run_finished · steps: 4 · heldout before: "
                                             "0.125 · heldout after: 0.25 · wall s: 63.2 · final checkpoint: "
                                             "runs/r1/checkpoints/step_000004"}
    generic = got["/generic", "run_finished"]
    assert generic["event"] == "run_finished" and generic["run"] == "r1" and generic["time"].endswith("+00:00")
    assert generic["fields"] == {"steps": 4, "heldout_before": 0.125, "heldout_after": 0.25, "wall_s": 63.2,
                                 "final_checkpoint": "runs/r1/checkpoints/step_000004"}
    recs = _records(cfg)
    assert [(r["event"], r["outcome"], r["tries"], r["status"]) for r in recs] == [
        ("run_started", "delivered", 1, 200), ("run_finished", "delivered", 1, 200), ("run_finished", "delivered", 1, 200)]
    assert {r["target"] for r in recs} == {webhook.url}  # scheme://host:port, never the path
    assert recs[-1]["body"] == generic  # what was sent, as sent


def test_server_down_retries_with_backoff_then_records_failure_and_never_blocks(tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _cfg(tmp_path, f"{{url: 'http://127.0.0.1:{port}/services/T0/B0/SECRETPATH'}}",
               "ops.notify_retries=2", "ops.notify_backoff_s=0.1", "ops.notify_timeout_s=1")
    n = Notifier.from_config(cfg, environ={})
    start = time.perf_counter()
    for step in range(10):
        n.emit("alarm_fired", step=step, kind="repetition")
    emitted = time.perf_counter() - start
    n.close(timeout=30)
    assert emitted < 0.05, f"emit blocked the caller for {emitted:.3f} s"
    recs = _records(cfg)
    assert [r["fields"]["step"] for r in (r["body"] for r in recs)] == list(range(10))  # in order
    for r in recs:
        assert r["outcome"] == "failed" and r["tries"] == 3 and "ConnectionRefusedError" in r["error"]
        assert r["seconds"] >= 0.3  # backoff 0.1 s, then 0.2 s
    err = capsys.readouterr().err
    assert "alarm_fired to http://127.0.0.1:" in err and "failed after 3 tries" in err
    assert "SECRETPATH" not in err and "SECRETPATH" not in (cfg.run_dir / "notifications.jsonl").read_text()


def test_slow_server_is_delivered_on_retry(tmp_path, make_webhook):
    hook = make_webhook(delay_first=1.5)  # the first answer comes after the client's 0.5 s timeout
    cfg = _cfg(tmp_path, f"{{url: '{hook.url}/'}}", "ops.notify_timeout_s=0.5", "ops.notify_retries=2",
               "ops.notify_backoff_s=0.1")
    n = Notifier.from_config(cfg, environ={})
    n.emit("run_preempted", step=3, resume="posttrain train runs/r1/config.yaml --resume")
    n.close(timeout=30)
    (rec,) = _records(cfg)
    assert rec["outcome"] == "delivered" and rec["tries"] == 2 and rec["status"] == 200 and rec["error"] is None
    assert len(hook.received) == 2 and hook.received[1][1]["fields"]["step"] == 3


def test_secrets_arrive_redacted_in_both_formats(tmp_path, webhook):
    secret = "s3cr3t-value-1234567"
    cfg = _cfg(tmp_path, f"{{url: '{webhook.url}/g'}}, {{url: '{webhook.url}/s', format: slack}}")
    n = Notifier.from_config(cfg, environ={"MY_SERVICE_TOKEN": secret})
    n.emit("run_failed", error=f"ValueError: the server rejected key {secret}", api_key="plain-key-value",
           db="postgres://alice:hunter2pass@db.internal/runs", hook=f"{webhook.url}/s")
    n.close()
    bodies = dict(webhook.received)
    assert bodies["/g"]["fields"] == {"error": "ValueError: the server rejected key <redacted>", "api_key": "<redacted>",
                                      "db": "postgres://alice:<redacted>@db.internal/runs", "hook": "<redacted>"}
    text = bodies["/s"]["text"]  # Slack escapes < and > (it shows them as typed)
    assert "key &lt;redacted&gt;" in text and "api key: &lt;redacted&gt;" in text and "alice:&lt;redacted&gt;@" in text
    on_disk = (cfg.run_dir / "notifications.jsonl").read_text()
    for leaked in (secret, "plain-key-value", "hunter2pass"):
        assert leaked not in json.dumps(webhook.received) and leaked not in on_disk


@pytest.mark.parametrize("override, names", [
    ("ops.notify=[{url: 'ftp://example.com/hook'}]", ["ops.notify.0.url", "http(s)", "'ftp'"]),
    ("ops.notify=[{url: 'hooks.slack.com/services/x'}]", ["ops.notify.0.url", "no scheme"]),
    ("ops.notify=[{url: 'http://h:port/x'}]", ["ops.notify.0.url", "no valid host:port"]),
    ("ops.notify=[{url: 'http://h/'}, {url: 'http://h/', events: [run_strated]}]",
     ["ops.notify.1.events", "'run_strated'", "did you mean 'run_started'", "node_lost, node_recovered"]),
    ("ops.notify_timeout_s=0", ["ops.notify_timeout_s", "greater than 0"]),
    ("ops.notify_retries=-1", ["ops.notify_retries", "greater than or equal to 0"]),
])
def test_bad_notify_config_names_the_key(override, names):
    with pytest.raises(PosttrainError) as e:
        load_config(None, [override])
    for part in names:
        assert part in str(e.value)


def test_slack_format_is_chosen_by_host_and_cli_rejects_bad_url():
    cfg = load_config(None, ["ops.notify=[{url: 'https://hooks.slack.com/services/T/B/X'}]"])
    assert cfg.ops.notify[0].format == "slack" and cfg.ops.notify[0].events == ["all"]
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", "config", "show", "ops.notify=[{url: 'file:///etc/x'}]"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "ops.notify.0.url is not an http(s) URL" in done.stderr


def test_alarm_and_gate_hooks_post_their_events(tmp_path, webhook):
    from posttrain.evals.alarm_wiring import LoopAlarms
    from posttrain.evals.in_loop import InLoopEval

    cfg = _cfg(tmp_path, f"{{url: '{webhook.url}/', events: [alarm_fired, gate_regressed]}}",
               "alarms.rules=[{kind: repetition, action: stop}]", "eval.suites=[addition]")
    n = Notifier.from_config(cfg, environ={})
    alarms = LoopAlarms(cfg, None, n.emit)
    for step, text in ((3, "abababab"), (4, "abababab"), (5, "abcdefgh"), (6, "abababab")):  # repetition 4/6 > 0.5
        alarms.observe({"step": step}, [text])  # or 0 at step 5: sent when it starts firing, not on every step
    gate = InLoopEval(cfg, actor=None, log=lambda m: None, notify=n.emit)
    for step, passes in ((2, 30), (4, 10)):  # 30 of 40 solved, then 10: regressed against both (McNemar)
        records = [{"id": str(i), "prompt": "p", "output": "o", "score": float(i < passes), "tokens": 1} for i in range(40)]
        (cfg.run_dir / f"checkpoints/step_{step:06d}").mkdir(parents=True)
        gate._gate({"step": step, "model_dir": "m", "seconds": 1.0, "samples": 40, "suites": [
            {"suite": "s", "kind": "generation", "summary": {"mean": passes / 40, "se": 0.0, "n": 40, "mean_tokens": 1.0},
             "records": records, "cached": False, "seconds": 1.0}]}, cfg.run_dir / f"checkpoints/step_{step:06d}")
    n.close()
    *alarm, regressed = (b for _, b in webhook.received)
    assert [(a["event"], a["fields"]["step"]) for a in alarm] == [("alarm_fired", 3), ("alarm_fired", 6)]
    assert alarm[0]["fields"]["kind"] == "repetition" and alarm[0]["fields"]["action"] == "stop"
    assert alarm[0]["fields"]["evidence"]["repetition_rate"] == pytest.approx(4 / 6)
    assert regressed["event"] == "gate_regressed" and regressed["fields"]["step"] == 4
    assert regressed["fields"]["regressed"] == ["vs_previous", "vs_best"] and regressed["fields"]["best_step"] == 2
    assert regressed["fields"]["diffs"]["vs_best/s/diff"] == pytest.approx(-0.5)


def test_failed_run_posts_the_error_and_the_resume_command(tmp_path, webhook):
    from posttrain.loop import train

    cfg = _cfg(tmp_path, f"{{url: '{webhook.url}/'}}", f"model.path={tmp_path / 'no-model'}", "task.train_size=50",
               "task.heldout_size=10")
    (cfg.run_dir / "checkpoints/step_000002").mkdir(parents=True)  # as left by an earlier attempt
    with pytest.raises(PosttrainError):  # the model directory is missing: fails before Ray starts
        train(cfg, progress=False)
    (body,) = (b for _, b in webhook.received)
    assert body["event"] == "run_failed" and body["run"] == "r1" and "no-model" in body["fields"]["error"]
    assert body["fields"]["resume"] == f"posttrain train {(cfg.run_dir / 'config.yaml').resolve()} --resume"
    assert body["fields"]["last_checkpoint"].endswith("step_000002")


def test_emit_never_raises_and_no_webhook_means_no_work(tmp_path, capsys):
    quiet = Notifier.from_config(load_config(None, [f"runs_dir={tmp_path}"]), environ={})
    assert quiet._thread is None
    quiet.emit("run_started", step=0)
    quiet.close()
    n = Notifier.from_config(_cfg(tmp_path, "{url: 'http://127.0.0.1:9/'}", "ops.notify_retries=0"), environ={})
    n.emit("no_such_event")
    n.emit("run_started", odd=object(), nan=float("nan"))  # not JSON: made JSON-safe, not raised
    n.close(timeout=10)
    assert "unknown event 'no_such_event'" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()  # nothing configured, nothing written


def test_webhook_urls_never_reach_the_tracking_sinks():
    from posttrain.tracking.run_log import logged_config

    url = "https://hooks.slack.com/services/T000/B000/abcdefghijklmnop"
    cfg = load_config(None, [f"ops.notify=[{{url: {url}}}]"])
    logged = json.dumps(logged_config(cfg))
    assert url not in logged and "abcdefghijklmnop" not in logged and "<redacted>" in logged
