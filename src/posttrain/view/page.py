"""The run page: one self-contained HTML file (inline SVG and CSS, no script, no CDN) with the learning curves,
KL / entropy / length, where each step's time went, how busy each role was, alarms, checkpoints with their gate
verdicts and sample completions (for multi-turn runs, whole conversations with their tool calls, and episode plots).
Numbers the page states carry `data-metric`/`data-value` attributes with the exact values from metrics.jsonl, so a
test (or a script) can check the page against the run."""

from __future__ import annotations

import datetime as dt
import json
from html import escape
from pathlib import Path

from posttrain.view.data import PHASES, RunView, busy_fractions
from posttrain.view.svg import Alarm, Series, hbars, line_chart, stacked_bars

PHASE_COLORS = {"generate": "#4c78a8", "reward": "#f58518", "reference": "#54a24b", "train": "#e45756",
                "sync": "#72b7b2", "other": "#b8b8b8"}
SMOOTH = 10  # steps in the reward curve's moving mean
SAMPLES_SHOWN = 8
SAMPLE_CHARS = 400
EPISODES_SHOWN = 4  # whole conversations per step (multi-turn runs)
TURN_CHARS = 800
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d", "#eeca3b")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
header{background:#1d232b;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .meta{color:#c8ced6;font-size:13px;margin-top:4px}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;font-size:12px;margin-left:8px;vertical-align:2px}
.badge.finished{background:#2e7d32}.badge.running{background:#ef6c00}
main{padding:16px 24px;display:grid;grid-template-columns:repeat(auto-fill,minmax(590px,1fr));gap:16px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:12px 14px}
section.wide{grid-column:1/-1}h2{font-size:15px;margin:0 0 8px}
table{border-collapse:collapse;width:100%;font-size:13px}td,th{border-bottom:1px solid #eceff2;padding:4px 8px;text-align:left;vertical-align:top}
th{color:#5b6672;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
svg.chart{max-width:100%;height:auto}.plot-bg{fill:#fbfcfd;stroke:#dde1e6}.grid{stroke:#eceff2}
.tick{font-size:10px;fill:#5b6672}.axis-label{font-size:11px;fill:#5b6672}.empty{font-size:13px;fill:#8a96a3}
.pass{color:#2e7d32;font-weight:600}.fail{color:#c62828;font-weight:600}.note{color:#8a5a00;font-size:12px}
pre{margin:0;white-space:pre-wrap;word-break:break-all;font:12px/1.35 ui-monospace,"DejaVu Sans Mono",monospace}
.episode{border:1px solid #dde1e6;border-radius:6px;margin:0 0 12px;padding:8px 10px}.episode h4{margin:0 0 6px;font-size:13px}
.turn{border-left:3px solid #b8b8b8;padding:4px 8px;margin:4px 0}.turn.assistant{border-color:#4c78a8}.turn.tool{border-color:#54a24b;background:#f7fbf6}
.turn-head{color:#5b6672;font-size:12px}.tool-call,.tool-result{border:1px dashed #9aa5b1;border-radius:4px;padding:3px 6px;margin:4px 0 0;font-size:12px}
.tool-call{background:#eef3fa}.tool-result{background:#eef7ec}.tool-call.bad,.tool-result.bad{background:#fdecea;border-color:#c62828}
"""


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(f'<span><i style="background:{c}"></i>{escape(n)}</span>' for n, c in items) + "</div>"


def _metric_cell(key: str, value, fmt: str = "{:.4f}") -> str:
    if value is None:
        return f'<td class="num" data-metric="{key}">—</td>'
    return f'<td class="num" data-metric="{key}" data-value="{value!r}">{fmt.format(value)}</td>'


def _series(steps: list[dict], key: str, color: str, **kw) -> Series:
    pts = [(m["step"], m[key]) for m in steps if m.get(key) is not None]
    return Series(key, [p[0] for p in pts], [p[1] for p in pts], color, **kw)


def _smoothed(s: Series, window: int) -> Series:
    ys = [sum(s.ys[max(0, i - window + 1):i + 1]) / len(s.ys[max(0, i - window + 1):i + 1]) for i in range(len(s.ys))]
    return Series(f"{s.name} (mean of last {window})", s.xs, ys, s.color, width=2.2)


def _summary_table(run: RunView) -> str:
    steps, evals = run.steps, run.evals
    last = steps[-1] if steps else {}
    rows = [
        ("steps done", _metric_cell("step", last.get("step"), "{:d}") if steps else _metric_cell("step", None)),
        ("reward (last step)", _metric_cell("reward_mean", last.get("reward_mean"))),
        ("sampled accuracy (last step)", _metric_cell("accuracy", last.get("accuracy"))),
        ("held-out accuracy (first eval)", _metric_cell("heldout_accuracy_first", evals[0][1] if evals else None)),
        ("held-out accuracy (latest eval)", _metric_cell("heldout_accuracy", evals[-1][1] if evals else None)),
        ("KL to reference (last step)", _metric_cell("kl", last.get("kl"), "{:.3e}")),
        ("entropy (last step)", _metric_cell("entropy", last.get("entropy"))),
        ("response length (last step, tokens)", _metric_cell("response_length", last.get("response_length"), "{:.2f}")),
        ("mean step time (s)", _metric_cell("mean_step_seconds", sum(m["time/step"] for m in steps) / len(steps) if steps else None)),
        ("not learning (learning monitor)", _no_progress_cell(run)),
    ]
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th>{cell}</tr>" for k, cell in rows) + "</table>"


def _no_progress_cell(run: RunView) -> str:
    """The first step the learning monitor fired (alarm/no_progress, evals/progress.py), its cause and figure."""
    first = next(((s, f["no_progress"]) for s, f in sorted(run.alarms.items()) if "no_progress" in f), None)
    if first is None:
        return '<td data-metric="no_progress_step">— (did not fire)</td>'
    step, got = first
    figure = got.get("figure") if isinstance(got, dict) else None
    what = f"{got.get('cause')} ({figure:.2g})" if figure is not None else str(got)
    return f'<td data-metric="no_progress_step" data-value="{step}">from step {step}: {escape(what)}</td>'


def _alarm_section(run: RunView) -> str:
    alarms = run.alarms
    if not alarms:
        return '<section><h2>Alarms</h2><p data-alarms="0">No alarm fired (no <code>alarm/*</code> key in metrics.jsonl).</p></section>'
    rows = "".join(f'<tr data-alarm-step="{s}"><td class="num">{s}</td><td>{escape(k)}</td><td>{escape(str(v))}</td></tr>'
                   for s, fired in sorted(alarms.items()) for k, v in fired.items())
    return (f'<section><h2>Alarms</h2><table data-alarms="{sum(len(v) for v in alarms.values())}">'
            f"<tr><th>step</th><th>alarm</th><th>value</th></tr>{rows}</table></section>")


def _checkpoint_section(run: RunView) -> str:
    if not run.checkpoints:
        return '<section><h2>Checkpoints</h2><p>No checkpoint written yet.</p></section>'
    rows = []
    for c in run.checkpoints:
        when = dt.datetime.fromtimestamp(c.created_unix, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if c.created_unix else "—"
        size = f"{c.bytes / 2**20:.1f} MiB" if c.bytes is not None else "—"
        state = "complete" if c.complete else "incomplete (no manifest)"
        gate = "—" if c.gate is None else f'<span class="{escape(c.gate.lower())}">{escape(c.gate)}</span> {escape(c.gate_detail)}'
        rows.append(f'<tr data-checkpoint-step="{c.step}"><td class="num">{c.step}</td><td>{escape(c.path.name)}</td>'
                    f'<td>{state}</td><td class="num">{size}</td><td>{when}</td><td data-gate="{escape(c.gate or "")}">{gate}</td></tr>')
    return ('<section><h2>Checkpoints</h2><table><tr><th>step</th><th>directory</th><th>state</th><th>size</th>'
            f'<th>written</th><th>gate verdict</th></tr>{"".join(rows)}</table></section>')


def pick_samples(samples: list, n: int = SAMPLES_SHOWN) -> list:
    """The first two samples of each prompt (ids are step/prompt_id/index), so several prompts show."""
    def index(sid) -> int:
        parts = str(sid).rsplit("/", 1)
        return int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else 0

    firsts = [s for s in samples if index(s[0]) < 2]
    return (firsts or samples)[:n]


def _clip(text, chars: int) -> str:
    text = str(text)
    return escape(text[:chars]) + ("…" if len(text) > chars else "")


def _tool_call(call: dict) -> str:
    if call.get("error"):  # did not parse: what the policy wrote instead
        return (f'<div class="tool-call bad" data-tool-error="{escape(str(call["error"]))}"><b>tool call: '
                f'{escape(str(call["error"]))}</b><pre>{_clip(call.get("text", ""), TURN_CHARS)}</pre></div>')
    args = json.dumps(call.get("arguments"), ensure_ascii=False)
    return (f'<div class="tool-call" data-tool="{escape(str(call.get("name")))}"><b>tool call {escape(str(call.get("name")))}</b>'
            f'<pre>{_clip(args, TURN_CHARS)}</pre></div>')


def _tool_result(result: dict) -> str:
    error = result.get("error")
    seconds = result.get("seconds")
    head = " · ".join([f'result of {escape(str(result.get("name")))}', *([f"error: {escape(str(error))}"] if error else []),
                       *([f"{seconds:.3g} s"] if isinstance(seconds, (int, float)) else [])])
    return (f'<div class="tool-result{" bad" if error else ""}" data-tool="{escape(str(result.get("name")))}" '
            f'data-tool-error="{escape(str(error or ""))}"><b>{head}</b><pre>{_clip(result.get("content", ""), TURN_CHARS)}</pre></div>')


def _episode(sid, record: dict, reward) -> str:
    """One episode as a conversation: each turn's role, tokens and text, its tool calls and results set apart."""
    turns = []
    for t in record.get("turns") or []:
        role = str(t.get("role"))
        env_reward = f' · environment reward {t["reward"]:.3g}' if isinstance(t.get("reward"), (int, float)) else ""
        turns.append(f'<div class="turn {escape(role)}" data-role="{escape(role)}"><div class="turn-head">{escape(role)} · '
                     f'{t.get("tokens", "?")} tokens{env_reward}</div><pre>{_clip(t.get("text", ""), TURN_CHARS)}</pre>'
                     + "".join(map(_tool_call, t.get("tool_calls") or []))
                     + "".join(map(_tool_result, t.get("tool_results") or [])) + "</div>")
    end, calls = str(record.get("end_reason")), record.get("tool_calls", 0)
    return (f'<div class="episode" data-episode="{escape(str(sid))}" data-end="{escape(end)}"><h4>{escape(str(sid))} · ended: '
            f'{escape(end)} · reward {reward:.3g} · {record.get("tokens", "?")} tokens (prompt included) · '
            f'{calls} tool call{"" if calls == 1 else "s"}</h4>{"".join(turns)}</div>')


def _samples_section(run: RunView) -> str:
    if not run.samples:
        return '<section class="wide"><h2>Sample completions</h2><p>No samples recorded yet.</p></section>'
    blocks = []
    for step in sorted(run.samples):
        episodes = run.episodes.get(step)
        if episodes:
            shown = [_episode(sid, episodes[str(sid)], reward) for sid, _, reward in pick_samples(run.samples[step], len(run.samples[step]))
                     if str(sid) in episodes][:EPISODES_SHOWN]
            blocks.append(f'<h3>step {step} <span class="note">({len(run.samples[step])} episodes; showing {len(shown)})</span></h3>'
                          f'<div data-episodes-step="{step}">{"".join(shown)}</div>')
            continue
        rows = "".join(
            f'<tr><td>{escape(str(sid))}</td><td><pre>{_clip(text, SAMPLE_CHARS)}</pre></td>'
            f'<td class="num">{reward:.3g}</td></tr>' for sid, text, reward in pick_samples(run.samples[step]))
        blocks.append(f'<h3>step {step} <span class="note">({len(run.samples[step])} samples; showing '
                      f'{min(SAMPLES_SHOWN, len(run.samples[step]))})</span></h3><table data-samples-step="{step}">'
                      f'<tr><th>id (step/prompt/sample)</th><th>completion</th><th>reward</th></tr>{rows}</table>')
    return '<section class="wide"><h2>Sample completions</h2>' + "".join(blocks) + "</section>"


def _keyed_series(steps: list[dict], prefix: str, where: str) -> list[Series]:
    """One series per `<prefix><name>` key any step has, 0.0 at the steps that report `where` but lack the key (an
    error kind or end reason that did not occur there is logged by omission)."""
    keys = sorted({k for m in steps for k in m if k.startswith(prefix)})
    rows = [m for m in steps if m.get(where) is not None]
    return [Series(k, [m["step"] for m in rows], [m.get(k) or 0.0 for m in rows], PALETTE[i % len(PALETTE)])
            for i, k in enumerate(keys)]


def _episode_charts(steps: list[dict], alarms: list[Alarm]) -> list[tuple[str, str, str, str]]:
    """Multi-turn runs (episode/* metrics, rollout/episode_metrics.py): turns, tool calls and their errors, why
    episodes ended, tokens. Nothing for single-turn runs, whose page stays as it was."""
    if not any("episode/turns" in m for m in steps):
        return []
    charts = [
        ("episodes", "Turns and tool calls per episode", [_series(steps, "episode/turns", "#4c78a8"),
                                                          _series(steps, "episode/tool_calls", "#f58518")], None),
        ("tool-calls", "Tool calls: valid share and error rate per kind (per call)",
         [_series(steps, "episode/tool_call_validity", "#2e7d32", width=2.2), _series(steps, "episode/tool_error_rate", "#c62828", width=2.2),
          *_keyed_series(steps, "episode/tool_errors/", "episode/tool_error_rate")], (0.0, 1.0)),
        ("episode-end", "Why episodes ended (share of episodes)", _keyed_series(steps, "episode/end/", "episode/turns"), (0.0, 1.0)),
        ("episode-tokens", "Tokens per episode (prompt included) and sampled", [_series(steps, "episode/tokens", "#8c564b"),
                                                                               _series(steps, "episode/sampled_tokens", "#6f4e9c")], None),
    ]
    return [(cid, title, line_chart(cid, title, series, alarms, y_range=y_range),
             _legend([(s.name.removeprefix("episode/"), s.color) for s in series if s.xs]))
            for cid, title, series, y_range in charts]


def build_page(run: RunView, *, refresh_seconds: int | None = None) -> str:
    """The whole page as a string. `refresh_seconds` adds a reload for a page served while the run goes on."""
    steps = run.steps
    alarms = [Alarm(s, sorted(v)) for s, v in sorted(run.alarms.items())]
    evals = run.evals
    reward = _series(steps, "reward_mean", "#9ab8d8", width=1.0)
    heldout = Series("eval/heldout_accuracy", [s for s, _ in evals], [a for _, a in evals], "#d62728", points=True, width=2)
    learning = [reward, _smoothed(reward, SMOOTH) if reward.xs else reward, _series(steps, "accuracy", "#f2a541", width=1.0, opacity=0.8), heldout]
    learning[1].color = "#1f5fa8"
    unit_range = (0.0, 1.0) if all(0 <= y <= 1 for s in learning for y in s.ys) else None
    charts = [
        ("learning", "Reward and held-out accuracy", line_chart("learning", "reward and held-out accuracy", learning, alarms, y_range=unit_range),
         _legend([("reward (per step)", "#9ab8d8"), (f"reward (mean of last {SMOOTH})", "#1f5fa8"),
                  ("sampled accuracy", "#f2a541"), ("held-out accuracy (greedy)", "#d62728")])),
        ("kl", "KL to the reference", line_chart("kl", "KL", [_series(steps, "kl", "#6f4e9c")], alarms), ""),
        ("entropy", "Policy entropy (nats/token)", line_chart("entropy", "entropy", [_series(steps, "entropy", "#2a9d8f")], alarms), ""),
        ("length", "Response length (tokens)", line_chart("length", "length", [_series(steps, "response_length", "#8c564b")], alarms), ""),
        *_episode_charts(steps, alarms),
    ]
    parts = {p: [m.get(f"time/{p}") or 0.0 for m in steps] for p in PHASES}
    split = stacked_bars("step-time", "step time split", [m["step"] for m in steps], parts, PHASE_COLORS)
    wall = sum(m.get("time/step") or 0.0 for m in steps) or 1e-9
    split_legend = _legend([(f"{p} {100 * sum(parts[p]) / wall:.1f}%", PHASE_COLORS[p]) for p in PHASES])
    busy = hbars("busy", "busy fraction per role", busy_fractions(steps))
    status = ("finished", "finished") if run.finished else ("running", "in progress (no summary.json yet)")
    total = f" of {run.total_steps}" if run.total_steps else ""
    done = steps[-1]["step"] if steps else 0
    model, task = (run.config.get("model") or {}).get("path", "?"), (run.config.get("task") or {}).get("name", "?")
    notes = "".join(f'<div class="note">{escape(n)}</div>' for n in run.notes)
    refresh = f'<meta http-equiv="refresh" content="{refresh_seconds}">' if refresh_seconds else ""
    chart_html = "".join(f'<section><h2>{escape(t)}</h2>{svg}{legend}</section>' for _, t, svg, legend in charts)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>posttrain run {escape(run.name)}</title>{refresh}
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head>
<body data-run="{escape(run.name)}" data-status="{status[0]}">
<header><h1>run {escape(run.name)}<span class="badge {status[0]}">{status[1]}</span></h1>
<div class="meta">step {done}{total} · model {escape(str(model))} · task {escape(str(task))} · {escape(str(run.run_dir))} · page built {now}</div>{notes}</header>
<main>
<section><h2>Where the run stands</h2>{_summary_table(run)}</section>
{_alarm_section(run)}
{chart_html}
<section><h2>Where a step's wall time went (seconds per step)</h2>{split}{split_legend}</section>
<section><h2>Busy fraction per role (share of step wall time)</h2>{busy}</section>
{_checkpoint_section(run)}
{_samples_section(run)}
</main></body></html>
"""


def write_page(run: RunView, out: Path, *, refresh_seconds: int | None = None) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(build_page(run, refresh_seconds=refresh_seconds))
    tmp.replace(out)  # a browser reloading mid-write sees the old page or the new one, never half of one
    return out
