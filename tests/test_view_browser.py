"""The run page in a real browser: Debian's chromium (installed by scripts/install_browser.sh, never downloaded by
playwright) opens the page `posttrain view` built from a real short GRPO run (Ray, HF engine, every sink on), and
the page is checked against the run's files: every plot drew marks, the numbers shown are metrics.jsonl's, the
checkpoints and samples are the run's. A copy of the run cut mid-write is served and followed as it grows. The run
also notifies a webhook server of the test's own (ops.notify)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.tracking import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
CHARTS = ("learning", "kl", "entropy", "length", "step-time", "busy")

# Per chart: how many marks (lines, points, bars) it drew and their total on-screen area in CSS pixels.
MARKS_JS = """() => Array.from(document.querySelectorAll('svg.chart')).map(svg => {
  const marks = svg.querySelectorAll('polyline, circle, rect[data-part], g[data-role] rect');
  let area = 0;
  for (const m of marks) { const r = m.getBoundingClientRect(); area += Math.max(r.width, 1) * Math.max(r.height, 1); }
  const box = svg.getBoundingClientRect();
  return {chart: svg.dataset.chart, marks: marks.length, area, width: box.width, height: box.height,
          alarms: svg.querySelectorAll('g.alarm').length};
})"""


@pytest.fixture(scope="module")
def webhook():
    """A real HTTP server on 127.0.0.1 for the run's ops.notify: its URL and the JSON bodies received, in order."""
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/", received
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, warm_model_dir, webhook):
    """4 GRPO steps on Ray with the HF engine; evals at 0, 2, 4; checkpoints at 2 and 4; every sink on; every
    notification to `webhook`."""
    from posttrain.loop import train

    cfg = load_config(None, [
        "name=viewed", f"runs_dir={tmp_path_factory.mktemp('runs')}", f"model.path={warm_model_dir}",
        # digits reward: partial credit gives every group reward variance, so every step trains (KL, entropy)
        "rollout.engine=hf", "algorithm.prompts_per_step=4", "algorithm.group_size=4", "task.reward=digits", "task.heldout_size=32",
        "train.steps=4", "eval.every=2", "checkpoint.every=2", "logging.progress=false",
        "logging.sinks=[jsonl,tensorboard,mlflow,wandb]", f"ops.notify=[{{url: '{webhook[0]}', events: [all]}}]",
    ])
    train(cfg, progress=False)
    return cfg.run_dir


def _view(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posttrain.cli", "view", *args], capture_output=True, text=True, timeout=120)


def test_loop_passes_every_step_to_the_configured_sinks(real_run):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = [m for m in read_metrics(real_run) if "time/step" in m]
    acc = EventAccumulator(str(real_run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    events = acc.Scalars("reward_mean")
    assert [e.step for e in events] == [m["step"] for m in steps] == [1, 2, 3, 4]
    assert [e.value for e in events] == pytest.approx([m["reward_mean"] for m in steps], abs=1e-6)  # float32 in events
    assert [e.step for e in acc.Tensors("checkpoint/text_summary")] == [2, 4]
    ids = json.loads((real_run / "tracking.json").read_text())
    run = MlflowClient(f"sqlite:///{real_run / 'mlflow.db'}").get_run(ids["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["checkpoint.latest"].endswith("step_000004")
    assert len(list((real_run / "wandb").glob(f"offline-run-*-{ids['wandb_run_id']}"))) == 1


def test_the_run_notified_its_start_and_finish(real_run, webhook):
    """ops.notify on a real run: the server got run_started then run_finished (nothing else fires here), both
    recorded as delivered in notifications.jsonl."""
    bodies = webhook[1]
    assert [(b["event"], b["run"]) for b in bodies] == [("run_started", "viewed"), ("run_finished", "viewed")]
    started, finished = bodies[0]["fields"], bodies[1]["fields"]
    assert started["step"] == 0 and started["steps"] == 4 and len(started["config_fingerprint"]) == 16
    assert finished["steps"] == 4 and finished["final_checkpoint"].endswith("step_000004")
    assert finished["heldout_before"] is not None and finished["heldout_after"] is not None
    records = [json.loads(l) for l in (real_run / "notifications.jsonl").read_text().splitlines()]
    assert [(r["event"], r["outcome"], r["tries"]) for r in records] == [("run_started", "delivered", 1),
                                                                         ("run_finished", "delivered", 1)]


def test_finished_run_page_in_chromium(real_run, browser, tmp_path):
    done = _view(str(real_run))
    assert done.returncode == 0, done.stderr
    page_path = real_run / "view" / "index.html"
    assert "http://" not in page_path.read_text().replace('xmlns="http://www.w3.org/2000/svg"', ""), "page must load nothing"
    metrics = read_metrics(real_run)
    steps = [m for m in metrics if "time/step" in m]
    evals = [(m["step"], m["eval/heldout_accuracy"]) for m in metrics if "eval/heldout_accuracy" in m]
    samples = {json.loads(l)["step"]: json.loads(l)["samples"] for l in (real_run / "samples.jsonl").read_text().splitlines()}

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(page_path.as_uri())
    assert page.get_attribute("body", "data-status") == "finished"
    # every plot rendered: six SVG charts, each with visible marks
    drawn = {c["chart"]: c for c in page.evaluate(MARKS_JS)}
    assert set(drawn) == set(CHARTS)
    for name, c in drawn.items():
        assert c["width"] > 100 and c["height"] > 50 and c["marks"] > 0 and c["area"] > 0, (name, c)
    assert all(m.get("entropy") is not None for m in steps), "every step trained: each curve has a point per step"
    assert drawn["step-time"]["marks"] == 6 * len(steps)  # one rect per phase per step (4 steps: no binning)
    assert drawn["busy"]["marks"] == 4  # rollout, trainer, reference, reward
    # the numbers shown are metrics.jsonl's (exact values in data-value, rounded ones in the text)
    def shown(key):
        cell = page.locator(f'[data-metric="{key}"]')
        return float(cell.get_attribute("data-value")), cell.inner_text()

    for key, want, fmt in [("reward_mean", steps[-1]["reward_mean"], "{:.4f}"), ("accuracy", steps[-1]["accuracy"], "{:.4f}"),
                           ("heldout_accuracy", evals[-1][1], "{:.4f}"), ("heldout_accuracy_first", evals[0][1], "{:.4f}"),
                           ("response_length", steps[-1]["response_length"], "{:.2f}")]:
        value, text = shown(key)
        assert value == want and text == fmt.format(want), key
    assert page.locator('[data-metric="step"]').inner_text() == "4"
    assert [s for s, _ in evals] == [0, 2, 4]
    assert page.locator('svg[data-chart="learning"] polyline[data-series="reward_mean"]').get_attribute("data-points") == "4"
    assert page.locator('svg[data-chart="learning"] g[data-series="eval/heldout_accuracy"] circle').count() == len(evals)
    assert float(page.locator('svg[data-chart="kl"] [data-series="kl"]').first.get_attribute("data-last")) == steps[-1]["kl"]
    # checkpoints (every 2 steps, keep_last 2) and sample completions at the first, middle and last step
    rows = page.locator("tr[data-checkpoint-step]")
    assert [int(rows.nth(i).get_attribute("data-checkpoint-step")) for i in range(rows.count())] == [2, 4]
    assert "complete" in rows.nth(1).inner_text()
    tables = page.locator("table[data-samples-step]")
    assert [int(tables.nth(i).get_attribute("data-samples-step")) for i in range(tables.count())] == [1, 3, 4]
    first = tables.nth(0).locator("tr").nth(1).locator("td")
    sid, text, reward = samples[1][0]
    assert first.nth(0).inner_text() == sid and first.nth(1).inner_text() == text
    shot = tmp_path / "view.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    page.close()


def test_served_page_follows_a_run_in_progress(real_run, browser, tmp_path):
    from posttrain.view.serve import PageBuilder, make_server

    # A copy of the run as it looked mid-step-3: no summary yet, the last line half written; step 2 raised an alarm.
    run = tmp_path / "live"
    shutil.copytree(real_run, run, ignore=shutil.ignore_patterns("wandb", "tensorboard", "mlflow*", "view"))
    (run / "summary.json").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    cut = next(i for i, l in enumerate(lines) if json.loads(l)["step"] == 3 and "time/step" in json.loads(l))
    early = [json.loads(l) for l in lines[:cut]]
    for m in early:
        if m["step"] == 2 and "time/step" in m:
            m["alarm/reward_hacking"] = 1
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in early) + lines[cut][:25])

    server = make_server(PageBuilder(run, run / "view" / "index.html", None, refresh_seconds=2), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    page = browser.new_page()
    try:
        page.goto(url)
        assert page.get_attribute("body", "data-status") == "running"
        assert page.locator('meta[http-equiv="refresh"]').count() == 1
        assert page.locator('[data-metric="step"]').inner_text() == "2"
        assert "incomplete" in page.locator("header").inner_text()
        drawn = {c["chart"]: c for c in page.evaluate(MARKS_JS)}
        assert all(drawn[c]["alarms"] == 1 for c in ("learning", "kl", "entropy", "length"))
        assert page.locator("tr[data-alarm-step='2']").inner_text().split("\t")[1] == "reward_hacking"

        # the run goes on: the rest of the lines land, then the summary; the page reloads itself and follows
        with (run / "metrics.jsonl").open("a") as fh:
            fh.write(lines[cut][25:] + "\n" + "".join(l + "\n" for l in lines[cut + 1:]))
        page.wait_for_function("document.querySelector('[data-metric=\"step\"]').innerText === '4'", timeout=15000)
        shutil.copy(real_run / "summary.json", run / "summary.json")
        page.wait_for_function("document.body.dataset.status === 'finished'", timeout=15000)
        assert page.locator('meta[http-equiv="refresh"]').count() == 0
    finally:
        page.close()
        server.shutdown()
        server.server_close()
