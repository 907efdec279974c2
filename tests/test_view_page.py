"""The run page without a browser: reading runs that are half written, alarms, gate verdicts, the numbers behind
the busy bars, tick placement, and the CLI's errors. (test_view_browser.py opens real pages in chromium.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.errors import PosttrainError
from posttrain.view import build_page, read_run
from posttrain.view.data import busy_fractions, default_sample_steps
from posttrain.view.svg import nice_ticks


def _step(step: int, reward: float, **extra) -> dict:
    rec = {"step": step, "reward_mean": reward, "accuracy": reward, "kl": 0.01 * step, "entropy": 1.0, "response_length": 4.0,
           "time/generate": 0.2, "time/reward": 0.05, "time/reference": 0.1, "time/train": 0.4, "time/sync": 0.05,
           "time/other": 0.2, "time/step": 1.0}
    rec.update(extra)
    return rec


def _write_run(root: Path, lines: list[str], *, samples: list[dict] = (), summary: bool = False) -> Path:
    run = root / "r"
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("name: r\ntrain:\n  steps: 10\nmodel:\n  path: m\ntask:\n  name: addition\n")
    (run / "metrics.jsonl").write_text("".join(lines))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    if summary:
        (run / "summary.json").write_text("{}")
    return run


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(0, 1) == [0.0, 0.25, 0.5, 0.75, 1.0]  # span 1 / 4 gaps = 0.25, a "nice" step
    assert nice_ticks(3.8, 4.4) == [3.8, 4.0, 4.2, 4.4]  # raw gap 0.15 -> 0.2; 3.8/0.2 must not floor to 18
    assert nice_ticks(1, 300, 6) == [0, 100, 200, 300]  # raw gap 59.8 -> 100


def test_busy_fraction_per_role_by_hand():
    steps = [_step(1, 0.1), _step(2, 0.2, **{"time/step": 3.0})]
    busy = busy_fractions(steps)
    # wall = 1 + 3 = 4 s; rollout = generate+sync = 2 * (0.2 + 0.05) = 0.5 s -> 0.125; trainer = 2 * (0.4 + 0.05) = 0.9
    # -> 0.225; reference 2 * 0.1 / 4 = 0.05; reward 2 * 0.05 / 4 = 0.025
    assert busy == pytest.approx({"rollout": 0.125, "trainer": 0.225, "reference": 0.05, "reward": 0.025})
    assert busy_fractions([_step(1, 0.1, **{"busy/reward": 0.5})])["reward"] == 0.5  # a role's own report wins


def test_run_in_progress_skips_a_half_written_last_line(tmp_path):
    lines = [json.dumps({"step": 0, "eval/heldout_accuracy": 0.1}) + "\n", json.dumps(_step(1, 0.25)) + "\n",
             json.dumps(_step(2, 0.5))[:30]]
    run = read_run(_write_run(tmp_path, lines))
    assert [m["step"] for m in run.steps] == [1] and not run.finished
    assert any("line 3 is incomplete" in n for n in run.notes)
    html = build_page(run, refresh_seconds=5)
    assert 'http-equiv="refresh" content="5"' in html and 'data-status="running"' in html
    assert re.search(r'data-metric="reward_mean" data-value="0.25">0.2500<', html)
    # samples.jsonl cut mid-line too: the step being written is neither listed nor shown
    full = "".join(json.dumps({"step": s, "samples": [[f"{s - 1}/p/0", "12", 1.0]]}) + "\n" for s in (1, 2))
    (run.run_dir / "samples.jsonl").write_text(full + '{"step": 3, "samples": [["2/p/0", "1')
    again = read_run(run.run_dir)
    assert again.sample_steps == [1, 2] and sorted(again.samples) == [1, 2]
    assert any("samples.jsonl: line 3 is incomplete" in n for n in again.notes)


def test_a_broken_line_before_the_end_names_file_and_line(tmp_path):
    lines = [json.dumps(_step(1, 0.25)) + "\n", "{not json\n", json.dumps(_step(3, 0.5)) + "\n"]
    with pytest.raises(PosttrainError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        read_run(_write_run(tmp_path, lines))


def test_alarms_are_marked_on_every_curve_and_listed(tmp_path):
    lines = [json.dumps(_step(s, 0.1 * s, **({"alarm/reward_hacking": 1, "alarm/kl_spike": 0} if s == 3 else {}))) + "\n"
             for s in range(1, 6)]
    html = build_page(read_run(_write_run(tmp_path, lines, summary=True)))
    for chart in ("learning", "kl", "entropy", "length"):
        svg = re.search(rf'<svg class="chart" data-chart="{chart}".*?</svg>', html).group(0)
        assert svg.count('class="alarm" data-step="3"') == 1, chart
    assert 'data-alarms="1"' in html and "reward_hacking" in html and "kl_spike" not in html  # 0 = did not fire
    assert "http-equiv" not in html  # a finished run's page does not reload itself


def test_checkpoints_with_gate_verdicts_and_chosen_sample_steps(tmp_path):
    samples = [{"step": s, "samples": [[f"{s - 1}/p{i}/{j}", f"out {s} {i} {j} <b>", float(j == 0)] for i in range(3) for j in range(4)]}
               for s in range(1, 6)]
    run_dir = _write_run(tmp_path, [json.dumps(_step(s, 0.1)) + "\n" for s in range(1, 6)], samples=samples)
    for step, gate in ((2, {"verdict": "pass", "reason": "held-out +3.1 points"}), (4, None)):
        d = run_dir / "checkpoints" / f"step_{step:06d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"step": step, "created_unix": 0, "files": {"a": {"bytes": 2**20}}}))
        if gate:
            (d / "gate.json").write_text(json.dumps(gate))
    (run_dir / "checkpoints" / "step_000005").mkdir()  # being written: no manifest yet
    run = read_run(run_dir, sample_steps=[2, 5])
    assert [(c.step, c.complete, c.gate) for c in run.checkpoints] == [(2, True, "pass"), (4, True, None), (5, False, None)]
    html = build_page(run)
    assert '<span class="pass">pass</span> held-out +3.1 points' in html and "incomplete (no manifest)" in html
    assert re.findall(r'data-samples-step="(\d+)"', html) == ["2", "5"]
    # two samples per prompt, in order; completions are escaped
    shown = re.findall(r"<td>(1/p\d/\d)</td>", html)
    assert shown == ["1/p0/0", "1/p0/1", "1/p1/0", "1/p1/1", "1/p2/0", "1/p2/1"]
    assert "out 2 0 0 &lt;b&gt;" in html and "<b>" not in html.split("<main>")[1].split("Sample completions")[1]
    assert default_sample_steps([1, 2, 3, 4]) == [1, 3, 4] and default_sample_steps([7]) == [7]


def test_a_run_that_has_only_started_renders(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    html = build_page(read_run(run_dir))
    assert html.count("no data yet") == 4 and "No checkpoint written yet" in html


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "300"}  # rich wraps error lines at the terminal's width
    return subprocess.run([sys.executable, "-m", "posttrain.cli", "view", *args], capture_output=True, text=True, timeout=60, env=env)


def test_cli_writes_the_page_and_reports_user_errors(tmp_path):
    run_dir = _write_run(tmp_path, [json.dumps(_step(1, 0.25)) + "\n"])
    done = _cli(str(run_dir), "--out", str(tmp_path / "page.html"))
    assert done.returncode == 0 and (tmp_path / "page.html").exists(), done.stderr
    missing = _cli(str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    bad = _cli(str(run_dir), "--steps", "1,x")
    assert bad.returncode == 2 and "--steps" in bad.stderr
