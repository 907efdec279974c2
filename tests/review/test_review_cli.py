"""`posttrain review` end to end on real tiny models: `new` (the transformers engine, as tests/evals/test_eval_hf.py
uses, to stay fast), judgments by a scripted reviewer, `results`, `export --pairs` read back by `posttrain rm train`,
`export --suite` loaded by the eval suites, flags as a regression suite, and bad inputs (exit 2, nothing stored).

A is the random tiny model, B the SFT-warm copy (tests/conftest.py); one generation (16 addition prompts) serves
every check of the module.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.errors import PosttrainError
from posttrain.review.store import ReviewStore

N = 16


def cli(*args: str):
    result = CliRunner().invoke(app, ["review", *args])
    result.text = " ".join(result.output.split())  # rich wraps long paths
    return result


def gold_verdict(prompt: str, out_a: str, out_b: str) -> str:
    """The scripted reviewer: the output closer to the true sum (digit credit minus a brevity term) wins; equal
    credit is a tie when both are right, both bad otherwise."""
    from posttrain.rewards.gold import addition_gold

    x, y = re.fullmatch(r"(\d+)\+(\d+)=", prompt).groups()
    answer = str(int(x) + int(y))
    ga, gb = addition_gold(answer, out_a), addition_gold(answer, out_b)
    if ga != gb:
        return "b" if gb > ga else "a"
    return "tie" if ga == 1.0 else "both_bad"


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory, tiny_model_dir, warm_model_dir):
    """A session of 16 addition prompts, every item judged: ann judges all she is given, then bob (who gets the
    four doubly reviewed items); bob answers 'tie' on the first of them where the rule says 'b', so the two
    reviewers disagree once."""
    root = tmp_path_factory.mktemp("review")
    db = root / "review.db"
    done = cli("new", "--a", tiny_model_dir, "--b", warm_model_dir, "--prompts", "addition", "--n", str(N),
               "--name", "t", "--db", str(db), "--double", "0.25", "--engine", "hf")
    assert done.exit_code == 0, done.output
    store = ReviewStore(db)
    verdicts: dict[str, list[str]] = {}
    flipped = False
    for reviewer in ("ann", "bob"):
        while (it := store.next_item("t", reviewer)) is not None:
            v = gold_verdict(it.prompt, it.output_a, it.output_b)
            if reviewer == "bob" and v == "b" and not flipped:
                v, flipped = "tie", True
            assert store.judge("t", it.id, reviewer, v)
            verdicts.setdefault(it.id, []).append(v)
    return {"root": root, "db": str(db), "store": store, "verdicts": verdicts, "new": done}


def test_new_stores_both_models_outputs_on_the_suite_prompts(reviewed, tiny_model_dir, warm_model_dir):
    store = reviewed["store"]
    (session,) = store.sessions()
    assert (session.a_model, session.b_model, session.source) == (tiny_model_dir, warm_model_dir, "suite addition")
    items = store.items("t")
    assert len(items) == N and sum(it.copies == 2 for it in items) == 4  # 25% of 16 doubly reviewed
    assert {it.source for it in items} == {"addition-heldout"}  # the first 16 prompts are the first suite's
    assert all(it.id.startswith("addition-heldout/") and re.fullmatch(r"\d+\+\d+=", it.prompt) for it in items)
    assert sum(it.output_a != it.output_b for it in items) >= N // 2  # two different models answered
    assert session.meta["engine"] == "hf" and session.meta["items"] == N
    assert f"session t: {N} items from suite addition" in reviewed["new"].text


def test_results_match_the_judgments(reviewed):
    verdicts = reviewed["verdicts"]
    # the per-item preference (a = 0, b = 1, tie = 0.5; both_bad apart) averaged over items with one
    prefs = []
    for vs in verdicts.values():
        values = [{"a": 0.0, "b": 1.0, "tie": 0.5}[v] for v in vs if v != "both_bad"]
        if values:
            prefs.append(sum(values) / len(values))
    out = reviewed["root"] / "results.json"
    done = cli("results", "t", "--db", reviewed["db"], "--json", str(out))
    assert done.exit_code == 0, done.output
    r = json.loads(out.read_text())
    assert set(r) == {"session", "a_model", "b_model", "items", "judgments", "win_rate", "ties", "both_bad",
                      "by_source", "agreement", "scorers"}
    assert r["items"] == N and r["judgments"] == N + 4
    assert r["win_rate"]["n"] == len(prefs) and r["win_rate"]["b_over_a"] == pytest.approx(sum(prefs) / len(prefs))
    assert r["win_rate"]["ci_low"] <= r["win_rate"]["b_over_a"] <= r["win_rate"]["ci_high"]
    assert r["ties"] == sum(p == 0.5 for p in prefs)
    assert r["both_bad"] == sum(all(v == "both_bad" for v in vs) for vs in verdicts.values())
    assert r["by_source"][0]["source"] == "addition-heldout" and r["by_source"][0]["n"] == len(prefs)
    doubled = [vs for vs in verdicts.values() if len(vs) == 2]
    assert r["agreement"]["n_pairs"] == 4
    assert r["agreement"]["observed"] == pytest.approx(sum(x == y for x, y in doubled) / 4)
    assert r["scorers"] == []
    wr = r["win_rate"]
    assert f"B over A win rate {wr['b_over_a']:.3f} 95% CI [{wr['ci_low']:.3f}, {wr['ci_high']:.3f}]" in done.text
    assert f"observed {r['agreement']['observed']:.3f} (4 doubly reviewed items)" in done.text


def test_pairs_export_trains_a_reward_model_and_the_suite_export_loads(reviewed, tiny_model_dir):
    from posttrain.evals.runner import preference_records
    from posttrain.evals.catalog import load_suites
    from posttrain.rewards.preferences import read_preferences

    root, db = reviewed["root"], reviewed["db"]
    pairs = root / "pairs.jsonl"
    done = cli("export", "t", "--db", db, "--pairs", str(pairs))
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    store = reviewed["store"]
    items = {it.id: it for it in store.items("t")}
    assert len(rows) >= 4 and len(read_preferences(pairs)) == len(rows)
    for row in rows:
        it = items[row["id"]]
        prefers_b = sum({"a": -1, "b": 1, "tie": 0, "both_bad": 0}[v] for v in row["votes"]) > 0
        assert (row["chosen"], row["rejected"]) == ((it.output_b, it.output_a) if prefers_b
                                                   else (it.output_a, it.output_b))

    rm_dir = root / "rm"
    trained = CliRunner().invoke(app, ["rm", "train", f"rm.data={pairs}", f"rm.base={tiny_model_dir}",
                                       f"rm.out={rm_dir}", "rm.epochs=1", "rm.batch_size=4",
                                       "rm.heldout_fraction=0.25", "--quiet"])
    assert trained.exit_code == 0, trained.output
    assert (rm_dir / "posttrain_reward.json").is_file()

    scored = cli("results", "t", "--db", db, "--rm", str(rm_dir))
    assert scored.exit_code == 0, scored.output
    assert f"scored with rm:{rm_dir}" in scored.text
    assert re.search(rf"rm:{re.escape(str(rm_dir))} agrees with the people on [01]\.\d{{3}} 95% CI "
                     rf"\[[01]\.\d{{3}}, [01]\.\d{{3}}\] \(n={len(rows)}\)", scored.text), scored.text

    suite_file = root / "suite.yaml"
    done = cli("export", "t", "--db", db, "--suite", str(suite_file), "--scorer-rm", str(rm_dir))
    assert done.exit_code == 0, done.output
    (suite,) = load_suites([str(suite_file)])
    assert (suite.name, suite.kind, len(suite.samples)) == ("review-t", "preference", len(rows))
    records = preference_records(suite)  # what `posttrain eval --suite` runs on it
    assert len(records) == len(rows) and all(r["score"] in (0.0, 0.5, 1.0) for r in records)


def test_flags_export_as_a_regression_suite_that_fails_only_on_a_repeat(tmp_path):
    from posttrain.evals.catalog import load_suites
    from posttrain.evals.suites import regression_failures

    db = tmp_path / "r.db"
    store = ReviewStore(db, create=True)
    store.flag("runs/x", 40, "s1", "ann", "reward_hacked", prompt="12+35=", output="47", reward=1.0)
    store.flag("runs/x", 40, "s1", "bob", "wrong_but_rewarded", prompt="12+35=", output="47", reward=1.0)
    store.flag("runs/x", 41, "s2", "ann", "good", prompt="1+1=", output="2", reward=1.0)
    store.flag("runs/x", 42, "s3", "ann", "reward_hacked", prompt="9+9=", output="18 18\n18", reward=1.0)
    store.flag("runs/y", 1, "s9", "ann", "reward_hacked", prompt="1+2=", output="3")
    out = tmp_path / "flags.yaml"
    done = cli("export-flags", "--run", "runs/x", "--out", str(out), "--db", str(db))
    assert done.exit_code == 0, done.output
    (suite,) = load_suites([str(out)])
    assert suite.kind == "regression" and [c["id"] for c in suite.samples] == ["step40-s1", "step42-s3"]
    case = suite.samples[0]
    assert case["prompt"] == "12+35=" and suite.sampling.max_new_tokens == 64
    assert regression_failures("47", case, []) and regression_failures(" 47 ", case, [])  # the repeat fails
    assert not regression_failures("147", case, []) and not regression_failures("47 apples", case, [])
    multiline = suite.samples[1]
    assert regression_failures("18 18\n18", multiline, []) and not regression_failures("18", multiline, [])
    missing = cli("export-flags", "--run", "runs/z", "--out", str(out), "--db", str(db))
    assert missing.exit_code == 2 and "no flags for this run" in missing.text and "runs/x, runs/y" in missing.text


def test_bad_inputs_exit_2_with_a_message_and_store_nothing(reviewed, tmp_path, tiny_model_dir, warm_model_dir):
    from posttrain.models.bpe import train_bpe_tokenizer
    from posttrain.models.tiny import build_tiny_model

    db = tmp_path / "bad.db"
    base = ["--a", tiny_model_dir, "--b", warm_model_dir, "--db", str(db), "--engine", "hf"]

    missing = cli("new", *base, "--prompts", str(tmp_path / "nope.jsonl"), "--n", "4")
    assert missing.exit_code == 2 and f"--prompts {tmp_path / 'nope.jsonl'}: file does not exist" in missing.text
    unknown = cli("new", *base, "--prompts", "no-such-suite", "--n", "4")
    assert unknown.exit_code == 2 and "--prompts no-such-suite: no such file, built-in suite" in unknown.text
    bad_row = tmp_path / "p.jsonl"
    bad_row.write_text('{"prompt": "1+1="}\n{"prompt": 7}\n')
    row = cli("new", *base, "--prompts", str(bad_row), "--n", "4")
    assert row.exit_code == 2 and f"{bad_row}, line 2: field 'prompt' must be a non-empty string" in row.text
    zero = cli("new", *base, "--prompts", "addition", "--n", "0")
    assert zero.exit_code == 2 and "--n 0: give a positive number of prompts" in zero.text
    not_model = cli("new", "--a", str(tmp_path), "--b", warm_model_dir, "--db", str(db), "--prompts", "addition")
    assert not_model.exit_code == 2 and "--a: " in not_model.text and "no config.json" in not_model.text

    tok = train_bpe_tokenizer(tmp_path / "bpe", 300, seed=0, lexicon_size=300, sentences=200)
    other = build_tiny_model(tmp_path / "tiny-bpe", "1m", seed=0, tokenizer=tok)
    differ = cli("new", "--a", tiny_model_dir, "--b", str(other), "--db", str(db), "--prompts", "addition")
    assert differ.exit_code == 2
    assert "config.json differs in" in differ.text and "vocab_size" in differ.text
    assert "the tokenizers' vocabularies differ (" in differ.text
    assert "loading B's weights into A's architecture" in differ.text
    assert not db.exists()  # nothing stored by any of them

    taken = cli("new", *base[:4], "--db", reviewed["db"], "--prompts", "addition", "--n", "2", "--name", "t")
    assert taken.exit_code == 2 and "--name t: session exists" in taken.text
    session = cli("results", "nope", "--db", reviewed["db"])
    assert session.exit_code == 2 and "unknown review session 'nope'" in session.text and "sessions: t" in session.text
    no_db = cli("results", "t", "--db", str(tmp_path / "none.db"))
    assert no_db.exit_code == 2 and "no review database here" in no_db.text
    neither = cli("export", "t", "--db", reviewed["db"])
    assert neither.exit_code == 2 and "give --pairs OUT.jsonl and/or --suite OUT.yaml" in neither.text
    assert [s.id for s in reviewed["store"].sessions()] == ["t"]


def test_exports_and_judge_scoring_on_a_hand_made_session(tmp_path, monkeypatch):
    """Chat prompts stay chat lists in --pairs and are left out of --suite (said so); identical outputs are left
    out; a judge's scores are stored under judge:URL and its template gets the chat prompt as text."""
    from posttrain.evals import scorers
    from posttrain.evals.catalog import load_suites
    from posttrain.review.export import export_pairs, export_suite
    from posttrain.review.results import score_session, session_results
    from posttrain.review.store import NewItem
    from posttrain.rewards.preferences import read_preferences

    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    store = ReviewStore(tmp_path / "r.db", create=True)
    store.create_session("h", "A", "B", "hand", [
        NewItem("p1", "1+1=", "2", "22", "s1"), NewItem("p2", chat, "four", "4", "s2"),
        NewItem("p3", "3+3=", "6", "6", "s1"), NewItem("p4", "5+5=", "10", "1", "s1")], double_share=0.0)
    for item, verdict in (("p1", "a"), ("p2", "b"), ("p3", "a"), ("p4", "tie")):
        store.judge("h", item, "ann", verdict)

    said = []
    assert export_pairs(store, "h", tmp_path / "pairs.jsonl", said.append) == 2  # p3: same text; p4: a tie
    assert said == ["left out 1 decided item(s) whose two outputs are the same text"]
    pairs = read_preferences(tmp_path / "pairs.jsonl")
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("1+1=", "2", "22"), (chat, "4", "four")]

    said.clear()
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "posttrain_reward.json").write_text("{}")
    assert export_suite(store, "h", tmp_path / "suite.yaml", scorer_rm=str(tmp_path / "rm"), log=said.append) == 1
    assert "left out 1 pair(s) with chat-format prompts" in said[0]
    monkeypatch.setitem(scorers.SCORERS, "reward_model", lambda path: lambda prompt, output, record: 0.0)
    (suite,) = load_suites([str(tmp_path / "suite.yaml")])
    assert [(s["id"], s["chosen"], s["rejected"]) for s in suite.samples] == [("p1", "2", "22")]

    seen = []

    def fake_judge(url):
        def score(prompt, output, record):
            seen.append(prompt)
            return 1.0 if output in ("2", "4") else 0.0
        return score

    monkeypatch.setitem(scorers.SCORERS, "judge", fake_judge)
    assert score_session(store, "h", judge_url="http://judge/v1") == ["judge:http://judge/v1"]
    assert "system: be brief\nuser: 2+2?" in seen
    r = session_results(store, "h")
    # decided: p1 (a; judge prefers "2" = A: agrees), p2 (b; judge prefers "4" = B: agrees), p3 (a; same text,
    # judge tie: 0.5) -> 2.5 / 3
    assert r["scorers"][0]["scorer"] == "judge:http://judge/v1"
    assert r["scorers"][0]["agree"] == pytest.approx(2.5 / 3) and r["scorers"][0]["n"] == 3
    # win rate: p1 0, p2 1, p3 0, p4 0.5 -> 1.5 / 4; ties: p4
    assert r["win_rate"]["b_over_a"] == pytest.approx(0.375) and r["ties"] == 1
    assert [(s["source"], s["n"], s["b_over_a"]) for s in r["by_source"]] == [("s1", 3, 0.5 / 3), ("s2", 1, 1.0)]


def test_plan_takes_the_first_n_prompts_with_their_sources(tmp_path):
    from posttrain.review.build import plan_review
    from posttrain.review.store import ReviewInputError

    plan = plan_review("addition", 205, seed=3, max_new_tokens=5)
    assert [(s.name, len(s.samples)) for s in plan.suites] == [("addition-heldout", 200), ("addition-sampled", 5)]
    assert plan.sources == ["addition-heldout"] * 200 + ["addition-sampled"] * 5 and plan.available == 300
    assert {(s.sampling.seed, s.sampling.max_new_tokens, s.sampling.n) for s in plan.suites} == {(3, 5, 1)}
    assert [s.sampling.temperature for s in plan.suites] == [0.0, 1.0]  # the suites' own, not overridden

    chat = [{"role": "user", "content": "hi"}]
    rows = [{"prompt": "1+1="}, {"prompt": chat, "id": "c", "source": "chat"}, {"prompt": "2+2=", "source": "x"}]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = plan_review(str(f), 10)
    (suite,) = plan.suites
    assert [(s["id"], s["prompt"]) for s in suite.samples] == [("1", "1+1="), ("c", chat), ("3", "2+2=")]
    assert plan.sources == ["p", "chat", "x"] and plan.available == 3  # fewer than --n: all of them
    assert (suite.sampling.temperature, suite.sampling.max_new_tokens) == (0.0, 64)

    f.write_text('{"prompt": "a", "id": 1}\n\n{"prompt": "b", "id": 1}\n')
    with pytest.raises(PosttrainError, match=r"p.jsonl, line 3: id '1' already used on line 1"):
        plan_review(str(f), 10)
    with pytest.raises(ReviewInputError, match="run:nowhere: nowhere is not a run directory"):
        plan_review("run:nowhere", 10)
