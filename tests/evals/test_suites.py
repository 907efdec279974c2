"""Suite files, scorers, regression properties and preference scoring (pure: no engine)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from posttrain.errors import PosttrainError
from posttrain.evals.catalog import load_suites
from posttrain.evals.runner import preference_records, summarize
from posttrain.evals.scorers import SCORERS, build_scorer, register_scorer
from posttrain.evals.suites import best_of_k_score, pairwise_score, read_suite_file, regression_failures


@pytest.fixture(autouse=True)
def hooks_importable(monkeypatch):
    """The python-hook scorers here name evalhooks:FUNCTION (tests/evals/evalhooks.py)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def write(tmp_path, text: str, name: str = "suite.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_best_of_k_by_hand():
    assert best_of_k_score(0.9, [0.1, 0.2, 0.3]) == 1.0      # strictly highest
    assert best_of_k_score(0.9, [0.9, 0.2, 0.3]) == 0.5      # tie with one other at the max: 1/2
    assert best_of_k_score(0.9, [0.9, 0.9, 0.9]) == 0.25     # all four tied: 1/4
    assert best_of_k_score(0.5, [0.9, 0.2, 0.3]) == 0.0      # a rejected one is higher
    assert (pairwise_score(1, 0), pairwise_score(1, 1), pairwise_score(0, 1)) == (1.0, 0.5, 0.0)


@pytest.mark.parametrize("spec,output,answer,expected", [
    ({"type": "exact"}, " 42 ", "42", 1.0),
    ({"type": "exact"}, "420", "42", 0.0),
    ({"type": "exact", "ignore_case": True}, "Yes", "yes", 1.0),
    ({"type": "numeric"}, "the answer is 42.0!", "42", 1.0),
    ({"type": "numeric", "tolerance": 0.5}, "41.6", "42", 1.0),
    ({"type": "numeric"}, "no number", "42", 0.0),
    ({"type": "regex", "pattern": r"\d+"}, "123", "x", 1.0),
    ({"type": "regex", "pattern": r"= {answer}", "full": False}, "so 1+1 = 2.", "2", 1.0),
    ({"type": "verifier", "task": "addition"}, "432", "432", 1.0),
    ({"type": "verifier", "task": "addition", "reward": "digits"}, "725", "724", pytest.approx(2 / 3)),
    ({"type": "python", "hook": "evalhooks:contains_answer"}, "it is 7", "7", 1.0),
])
def test_scorers(spec, output, answer, expected):
    assert build_scorer(spec, where="t")("p", output, {"id": "s", "answer": answer}) == expected


def test_model_scorers_check_their_options():
    with pytest.raises(PosttrainError, match="suite x, field scorer: reward_model scorer: rm/ is not a reward-model"):
        build_scorer({"type": "reward_model", "path": "rm/"}, where="f.yaml, suite x")
    with pytest.raises(PosttrainError, match="suite x, field scorer: gold scorer: task 'sorting' has no gold"):
        build_scorer({"type": "gold", "task": "sorting"}, where="f.yaml, suite x")
    with pytest.raises(PosttrainError, match="bad options for scorer 'judge'"):
        build_scorer({"type": "judge"}, where="f")  # url is required


def test_gold_scorer_by_hand():
    gold = build_scorer({"type": "gold"}, where="f")
    # digit credit minus 0.1 per character beyond the answer: '432' -> 1; '431' -> 2/3; '4320' -> 0 - 0.1
    assert gold("p", "432", {"answer": "432"}) == 1.0
    assert gold("p", "431", {"answer": "432"}) == pytest.approx(2 / 3)
    assert gold("p", "4320", {"answer": "432"}) == pytest.approx(-0.1)


def test_judge_scorer_against_a_local_endpoint(tmp_path):
    """A stdlib HTTP server on 127.0.0.1 answering in the OpenAI chat format (the judge itself is tested against
    vLLM's server in tests/test_judge.py): the reply 7 on 0..10 is 0.7; a dead endpoint is an error."""
    import http.server
    import json
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"choices": [{"message": {"content": "7"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        judge = build_scorer({"type": "judge", "url": url, "cache": str(tmp_path / "c.sqlite"), "model": "m"},
                             where="f")
        assert judge("12+34=", "46", {"id": "a"}) == pytest.approx(0.7)
        assert "Answer: 46" in seen[0]["messages"][0]["content"] and seen[0]["model"] == "m"
    finally:
        server.shutdown()
        server.server_close()  # the port now refuses connections
    dead = build_scorer({"type": "judge", "url": url, "retries": 0, "timeout_s": 5, "cache": str(tmp_path / "d.sqlite")},
                        where="f")
    with pytest.raises(PosttrainError, match="judge scorer, sample b: judge request failed"):
        dead("1+1=", "2", {"id": "b"})


def test_bad_scorers_say_what_to_do():
    with pytest.raises(PosttrainError, match="scorer.type: unknown scorer 'bleu'"):
        build_scorer({"type": "bleu"}, where="f")
    with pytest.raises(PosttrainError, match="bad options for scorer 'regex'"):
        build_scorer({"type": "regex"}, where="f")
    with pytest.raises(PosttrainError, match="cannot load 'evalhooks:nope'"):
        build_scorer({"type": "python", "hook": "evalhooks:nope"}, where="f")


def test_register_scorer_replaces_a_scorer():
    saved = SCORERS["reward_model"]
    try:
        register_scorer("reward_model", lambda scale=1.0: (lambda p, o, r: scale * len(o)))
        assert build_scorer({"type": "reward_model", "scale": 2.0}, where="f")("p", "abc", {}) == 6.0
    finally:
        register_scorer("reward_model", saved)


def test_regression_properties():
    case = {"must_contain": ["42"], "must_not_contain": ["sorry"], "format": r"\d+", "min_chars": 2, "max_chars": 3}
    assert regression_failures("42", case, []) == []
    assert regression_failures("sorry 4", case, []) == [
        "must_contain '42'", "must_not_contain 'sorry'", r"format '\\d+'", "max_chars 3"]
    refuse = {"must_refuse": True}
    pats = [r"\bI can(?:'|no)t\b", r"\bI(?:'m| am) sorry\b"]
    assert regression_failures("I'm sorry, I can't help with that.", refuse, pats) == []
    assert regression_failures("Sure! Step one...", refuse, pats) == ["must_refuse"]


def test_builtin_suites_resolve():
    suites = load_suites(["addition", "sorting-heldout"])
    assert [s.name for s in suites] == ["addition-heldout", "addition-sampled", "addition-format", "sorting-heldout"]
    heldout = suites[0]
    assert len(heldout.samples) == 200 and heldout.samples[0]["prompt"].endswith("=")
    assert heldout.score("p", heldout.samples[0]["answer"], heldout.samples[0]) == 1.0
    assert load_suites(["addition"])[0].digest == heldout.digest  # deterministic: part of the cache key


def test_preference_suite_pairwise_and_best_of_4(tmp_path):
    # Scorer = output length. p1: chosen "aaaa" (4) > "a" (1) -> 1. p2: chosen "bb" (2) ties "cc" at the max,
    # others 1 -> best-of-4 = 1/2. p3: chosen "d" (1) < "dddd" (4) -> 0. Mean = 1.5 / 3 = 0.5.
    f = write(tmp_path, """
        suites:
          - name: prefs
            kind: preference
            scorer: {type: python, hook: "evalhooks:length_score"}
            pairs:
              - {id: p1, prompt: q, chosen: aaaa, rejected: a}
              - {id: p2, prompt: q, chosen: bb, rejected: [cc, x, y]}
              - {id: p3, prompt: q, chosen: d, rejected: dddd}
    """)
    (suite,) = read_suite_file(f)
    records = preference_records(suite)
    assert [r["score"] for r in records] == [1.0, 0.5, 0.0]
    assert summarize(records)["mean"] == pytest.approx(0.5)


def test_jsonl_samples_path_relative_to_the_suite_file(tmp_path):
    (tmp_path / "qa.jsonl").write_text('{"id": "a", "prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    f = write(tmp_path, """
        suites:
          - {name: qa, kind: generation, path: qa.jsonl, scorer: {type: exact}}
    """)
    (suite,) = read_suite_file(f)
    assert [s["id"] for s in suite.samples] == ["a", "1"]


@pytest.mark.parametrize("body,message", [
    ("suites:\n  - {name: s1, kind: generation, scorer: {type: exact}, samples: [{prompt: a}], sampling: {temprature: 1}}",
     "suite s1, field sampling.temprature: Extra inputs are not permitted"),
    ("suites:\n  - {name: s2, kind: regression, cases: [{id: a, prompt: b, max_chars: -1}]}",
     "suite s2, field cases.0.max_chars"),
    ("suites:\n  - {name: s3, kind: generation, scorer: {type: exact}}",
     "suite s3: give exactly one of samples, path, task"),
    ("suites:\n  - {name: s4, kind: generation, scorer: {type: exact}, samples: [{id: a, prompt: x}, {id: a, prompt: y}]}",
     "suite s4, field samples\\[1\\].id: duplicate id 'a'"),
    ("suites:\n  - {name: s5, kind: quiz}", "suite s5, field kind"),
    ("suites:\n  - {name: s6, kind: generation, scorer: {type: judge}, samples: [{prompt: a}]}",
     "suite s6, field scorer: bad options for scorer 'judge'"),
    ("suites: [", "not valid YAML"),
    ("tasks: []", "needs a top-level list 'suites:'"),
])
def test_suite_file_errors_name_file_suite_and_field(tmp_path, body, message):
    f = write(tmp_path, body)
    with pytest.raises(PosttrainError, match=message) as e:
        read_suite_file(f)
    assert str(f) in str(e.value)


def test_unknown_suite_reference():
    with pytest.raises(PosttrainError, match="--suite nonesuch: no such file"):
        load_suites(["nonesuch"])


BATCH_FN = '''
from pathlib import Path

def length_batch(prompts, completions, **kwargs):  # logs each call's batch size beside this file
    with open(Path(__file__).with_suffix(".calls"), "a") as f:
        f.write(f"{len(completions)}\\n")
    return [float(len(c)) for c in completions]
'''


def test_a_batch_function_scorer_is_called_once_per_suite_and_its_source_is_in_the_cache_key(tmp_path):
    # Score = length. p1: chosen "aaa" (3) > "a" (1) -> 1. p2: chosen "bb" (2) < "bbbb" (4) -> 0 (best of 3).
    # Five completions in all, scored by one call of the batch function.
    fn = tmp_path / "fns.py"
    fn.write_text(BATCH_FN)
    f = write(tmp_path, f"""
        suites:
          - name: prefs
            kind: preference
            scorer: {{type: function, fn: "{fn}:length_batch"}}
            pairs:
              - {{id: p1, prompt: q, chosen: aaa, rejected: a}}
              - {{id: p2, prompt: q, chosen: bb, rejected: [bbbb, b]}}
    """)
    (suite,) = read_suite_file(f)
    records = preference_records(suite)
    assert [(r["score"], r["chosen_score"], r["rejected_scores"]) for r in records] == [(1.0, 3.0, [1.0]),
                                                                                         (0.0, 2.0, [4.0, 1.0])]
    assert (tmp_path / "fns.calls").read_text().split() == ["5"]
    assert read_suite_file(f)[0].digest == suite.digest  # unchanged code: the same cache key
    fn.write_text(BATCH_FN + "# edited\n")  # editing the function must not return stale cached results
    assert read_suite_file(f)[0].digest != suite.digest


def test_eval_report_shows_a_chat_prompt_as_role_lines():
    """A dataset's chat-format prompt (a list of messages) in a record: the report renders it as text (it raised
    "'list' object has no attribute 'replace'" and stopped the in-loop evaluator of the custom-task example)."""
    from posttrain.evals.report import eval_report

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 < 3?"}]
    suite = {"suite": "run_reward", "kind": "generation", "cached": False,
             "summary": {"n": 1, "mean": 0.0, "se": 0.0, "mean_tokens": 2.0},
             "records": [{"id": "r1", "prompt": chat, "output": "yes", "score": 0.0, "tokens": 2}]}
    html = eval_report("m", [suite])
    assert "<pre>system: Be brief.\nuser: 2 &lt; 3?</pre>" in html
