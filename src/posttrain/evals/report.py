"""A self-contained HTML report of an eval or a comparison: inline SVG plots (score per suite with standard
errors, completion length distributions), the summary table, and the biggest wins and losses with their text.
No scripts, no external files: one .html that opens anywhere."""

from __future__ import annotations

from collections import Counter
from html import escape

from posttrain.tasks.base import prompt_text

COLORS = ("#3b6fb6", "#d9822b")
STYLE = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
         "pre{white-space:pre-wrap;margin:0;font-size:12px}.bad{color:#b00}.good{color:#070}")


def score_bars_svg(names: list[str], series: list[tuple[str, list[float], list[float]]]) -> str:
    """Grouped bars: for each suite, one bar per series (label, means, standard errors), scores in [0, 1]
    drawn with +-1 SE whiskers."""
    w, h, pad = 120 * max(1, len(names)) + 60, 220, 40
    group = (w - pad - 10) / max(1, len(names))
    bar = group * 0.7 / len(series)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 40}">',
             f'<line x1="{pad}" y1="{h}" x2="{w}" y2="{h}" stroke="#333"/>']
    for tick in (0, 0.5, 1):
        y = h - tick * (h - 20)
        parts.append(f'<text x="{pad - 5}" y="{y + 4}" font-size="10" text-anchor="end">{tick}</text>'
                     f'<line x1="{pad}" y1="{y}" x2="{w}" y2="{y}" stroke="#eee"/>')
    for i, name in enumerate(names):
        x0 = pad + i * group + group * 0.15
        for j, (label, means, ses) in enumerate(series):
            m, se = max(0.0, min(1.0, means[i])), ses[i]
            x, top = x0 + j * bar, h - m * (h - 20)
            parts.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{bar:.1f}" height="{h - top:.1f}" '
                         f'fill="{COLORS[j % 2]}"><title>{escape(label)} {escape(name)}: {means[i]:.3f} '
                         f'+- {se:.3f}</title></rect>')
            lo, hi = h - max(0, m - se) * (h - 20), h - min(1, m + se) * (h - 20)
            cx = x + bar / 2
            parts.append(f'<line x1="{cx:.1f}" y1="{lo:.1f}" x2="{cx:.1f}" y2="{hi:.1f}" stroke="#000"/>')
        parts.append(f'<text x="{x0 + group * 0.35:.1f}" y="{h + 15}" font-size="11" text-anchor="middle">'
                     f'{escape(name)}</text>')
    for j, (label, _, _) in enumerate(series):
        parts.append(f'<rect x="{pad + 150 * j}" y="{h + 25}" width="10" height="10" fill="{COLORS[j % 2]}"/>'
                     f'<text x="{pad + 150 * j + 14}" y="{h + 34}" font-size="11">{escape(label)}</text>')
    return "".join(parts) + "</svg>"


def length_histogram_svg(title: str, series: list[tuple[str, list[int]]]) -> str:
    """Completion lengths (tokens) as side-by-side bars per length, one colour per series."""
    counts = [Counter(lengths) for _, lengths in series]
    lengths = sorted(set().union(*counts)) or [0]
    top = max((c[n] for c in counts for n in lengths), default=1) or 1
    w, h, pad = max(200, 24 * len(lengths) + 60), 140, 30
    slot = (w - pad) / len(lengths)
    bar = slot * 0.8 / len(series)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 35}">',
             f'<text x="{pad}" y="12" font-size="12">{escape(title)}: completion length (tokens)</text>']
    for i, n in enumerate(lengths):
        for j, c in enumerate(counts):
            bh = c[n] / top * (h - 25)
            x = pad + i * slot + j * bar
            parts.append(f'<rect x="{x:.1f}" y="{h - bh:.1f}" width="{bar:.1f}" height="{bh:.1f}" '
                         f'fill="{COLORS[j % 2]}"><title>{escape(series[j][0])}: {c[n]} at {n} tokens</title></rect>')
        parts.append(f'<text x="{pad + i * slot + slot * 0.4:.1f}" y="{h + 14}" font-size="10" '
                     f'text-anchor="middle">{n}</text>')
    return "".join(parts) + "</svg>"


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{escape(str(c))}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, sections: list[str]) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>{''.join(sections)}</body></html>")


def eval_report(model: str, results: list[dict]) -> str:
    """`results`: results.json's "suites" list (suite, kind, summary, records)."""
    names = [r["suite"] for r in results]
    bars = score_bars_svg(names, [(model, [r["summary"]["mean"] for r in results],
                                   [r["summary"]["se"] for r in results])])
    table = _table(["suite", "kind", "n", "mean", "SE", "mean tokens", "cached"],
                   [[escape(r["suite"]), r["kind"], r["summary"]["n"], f"{r['summary']['mean']:.3f}",
                     f"{r['summary']['se']:.3f}", f"{r['summary']['mean_tokens']:.1f}", r["cached"]] for r in results])
    hists = "".join(length_histogram_svg(r["suite"], [(model, [x["tokens"] for x in r["records"]])])
                    for r in results if r["kind"] != "preference")
    fails = []
    for r in results:
        bad = [x for x in r["records"] if x["score"] < 1][:5]
        if bad:
            fails.append(f"<h3>{escape(r['suite'])}: lowest-scoring samples</h3>" + _table(
                ["id", "prompt", "output", "score"],
                [[escape(x["id"]), f"<pre>{escape(prompt_text(x['prompt']))}</pre>", f"<pre>{escape(x['output'])}</pre>",
                  f"{x['score']:.2f}" + (f" ({escape('; '.join(x['failed']))})" if x.get("failed") else "")]
                 for x in bad]))
    return _page(f"posttrain eval: {model}", ["<h2>Score per suite (mean +- 1 SE)</h2>", bars, table,
                                              "<h2>Length distributions</h2>", hists, *fails])


def compare_report(name_a: str, name_b: str, rows: list[dict], results_a: list[dict], results_b: list[dict],
                   changes: dict[str, tuple[list[dict], list[dict]]], markdown: str) -> str:
    names = [r["suite"] for r in rows]
    sa = {r["suite"]: r for r in results_a}
    sb = {r["suite"]: r for r in results_b}
    bars = score_bars_svg(names, [(f"A {name_a}", [sa[n]["summary"]["mean"] for n in names],
                                   [sa[n]["summary"]["se"] for n in names]),
                                  (f"B {name_b}", [sb[n]["summary"]["mean"] for n in names],
                                   [sb[n]["summary"]["se"] for n in names])])
    table = _table(["suite", "n", "A", "B", "diff [95% CI]", "test", "p", "p (Holm)", "W/T/L", "verdict"],
                   [[escape(r["suite"]), r["n"], f"{r['mean_a']:.3f}", f"{r['mean_b']:.3f}",
                     f"{r['diff']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]", r["test"], f"{r['p_value']:.3g}",
                     f"{r['p_holm']:.3g}", f"{r['wins']}/{r['ties']}/{r['losses']}",
                     f"<span class='{'bad' if r['verdict'] == 'regressed' else 'good'}'>{r['verdict']}</span>"]
                    for r in rows])
    hists = "".join(length_histogram_svg(n, [("A", [x["tokens"] for x in sa[n]["records"]]),
                                             ("B", [x["tokens"] for x in sb[n]["records"]])])
                    for n in names if sa[n]["kind"] != "preference")
    sections = ["<h2>Score per suite (mean +- 1 SE)</h2>", bars, "<h2>Paired comparison</h2>", table,
                f"<details><summary>markdown</summary><pre>{escape(markdown)}</pre></details>",
                "<h2>Length distributions</h2>", hists]
    for n, (wins, losses) in changes.items():
        for label, items in (("biggest wins of B", wins), ("biggest losses of B", losses)):
            if items:
                sections.append(f"<h3>{escape(n)}: {label}</h3>" + _table(
                    ["id", "prompt", "A output", "B output", "A", "B"],
                    [[escape(x["id"]), f"<pre>{escape(prompt_text(x['prompt']))}</pre>", f"<pre>{escape(x['output_a'])}</pre>",
                      f"<pre>{escape(x['output_b'])}</pre>", f"{x['score_a']:.2f}", f"{x['score_b']:.2f}"]
                     for x in items]))
    return _page(f"posttrain compare: {name_b} vs {name_a}", sections)
