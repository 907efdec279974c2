"""Checkpoint B against checkpoint A on identical samples: per suite a paired bootstrap CI of the mean
difference (B - A), McNemar for binary scores, Holm across suites, win/tie/loss counts, and a verdict.

A suite *regresses* when B's mean is lower than A's by more than `margin` (score units) and the difference is
significant after Holm correction (adjusted p <= alpha); the p-value is McNemar's when both sides' scores are
binary, otherwise the paired bootstrap's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from posttrain.errors import PosttrainError
from posttrain.evals.stats import holm, is_binary, mcnemar, paired_bootstrap, win_tie_loss


@dataclass
class SuiteComparison:
    suite: str
    n: int
    mean_a: float
    mean_b: float
    diff: float  # mean(B - A)
    ci_low: float
    ci_high: float
    test: str  # "mcnemar/exact-binomial", "mcnemar/chi2-continuity" or "paired-bootstrap"
    p_value: float
    p_holm: float
    wins: int
    ties: int
    losses: int
    verdict: str  # "regressed", "improved" or "no significant change"


def paired_scores(a_records: list[dict], b_records: list[dict], suite: str) -> tuple[list[str], list, list]:
    """Scores of A and B on the same sample ids, in A's order; the id sets must match exactly."""
    a = {r["id"]: r["score"] for r in a_records}
    b = {r["id"]: r["score"] for r in b_records}
    if a.keys() != b.keys():
        raise PosttrainError(f"compare, suite {suite}: the two result sets cover different samples "
                             f"({len(a.keys() - b.keys())} only in A, {len(b.keys() - a.keys())} only in B)",
                             hint="evaluate both models on the same suite file")
    ids = [r["id"] for r in a_records]
    return ids, [a[i] for i in ids], [b[i] for i in ids]


def compare_suites(
    per_suite: dict[str, tuple[list[dict], list[dict]]], *, margin: float = 0.0, alpha: float = 0.05,
    n_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95,
) -> list[SuiteComparison]:
    """`per_suite` maps a suite name to (A's records, B's records)."""
    rows, p_values = [], []
    for name, (ra, rb) in per_suite.items():
        _, a, b = paired_scores(ra, rb, name)
        boot = paired_bootstrap(a, b, n_resamples=n_resamples, confidence=confidence, seed=seed)
        if is_binary(a) and is_binary(b):
            mc = mcnemar(a, b)
            test, p = f"mcnemar/{mc.method}", mc.p_value
        else:
            test, p = "paired-bootstrap", boot.p_value
        wtl = win_tie_loss(a, b)
        rows.append(dict(suite=name, n=len(a), mean_a=sum(a) / len(a), mean_b=sum(b) / len(b), diff=boot.mean_diff,
                         ci_low=boot.ci_low, ci_high=boot.ci_high, test=test, p_value=p,
                         wins=wtl.wins, ties=wtl.ties, losses=wtl.losses))
        p_values.append(p)
    out = []
    for row, p_adj in zip(rows, holm(p_values)):
        significant = p_adj <= alpha
        if significant and row["diff"] < -margin:
            verdict = "regressed"
        elif significant and row["diff"] > 0:
            verdict = "improved"
        else:
            verdict = "no significant change"
        out.append(SuiteComparison(**row, p_holm=p_adj, verdict=verdict))
    return out


def any_regression(rows: list[SuiteComparison]) -> bool:
    return any(r.verdict == "regressed" for r in rows)


def markdown_summary(rows: list[SuiteComparison], *, name_a: str, name_b: str, margin: float, alpha: float,
                     confidence: float = 0.95) -> str:
    pct = round(confidence * 100)
    lines = [
        f"**B** = `{name_b}` against **A** = `{name_a}` (diff = B - A; regression: diff < -{margin:g} with "
        f"Holm-adjusted p <= {alpha:g})",
        "",
        f"| suite | n | A | B | diff [{pct}% CI] | test | p | p (Holm) | W/T/L | verdict |",
        "|---|---:|---:|---:|---|---|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.suite} | {r.n} | {r.mean_a:.3f} | {r.mean_b:.3f} | {r.diff:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
            f" | {r.test} | {r.p_value:.3g} | {r.p_holm:.3g} | {r.wins}/{r.ties}/{r.losses} | {r.verdict} |"
        )
    verdict = "FAIL: B regresses" if any_regression(rows) else "PASS: no significant regression"
    lines += ["", f"**{verdict}**"]
    return "\n".join(lines) + "\n"


def biggest_changes(a_records: list[dict], b_records: list[dict], k: int = 5) -> tuple[list[dict], list[dict]]:
    """The k samples where B gained most over A (wins) and lost most (losses), with both outputs."""
    b = {r["id"]: r for r in b_records}
    pairs = [{"id": r["id"], "prompt": r["prompt"], "output_a": r["output"], "output_b": b[r["id"]]["output"],
              "score_a": r["score"], "score_b": b[r["id"]]["score"], "delta": b[r["id"]]["score"] - r["score"]}
             for r in a_records if r["id"] in b]
    wins = sorted((p for p in pairs if p["delta"] > 0), key=lambda p: -p["delta"])[:k]
    losses = sorted((p for p in pairs if p["delta"] < 0), key=lambda p: p["delta"])[:k]
    return wins, losses


def rows_to_json(rows: list[SuiteComparison]) -> list[dict]:
    return [asdict(r) for r in rows]
