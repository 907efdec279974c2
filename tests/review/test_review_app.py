"""The review web app through Starlette's TestClient (no browser, no server process): judging, bad input with its
status and message and nothing stored, the token gate, escaping of hostile model text, the runs root, and the
sample browser's reading and filtering functions on a hand-written run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from posttrain.review import run_samples
from posttrain.review.app import REVIEWER_COOKIE, TOKEN_COOKIE, make_app
from posttrain.review.store import NewItem, ReviewStore

HOSTILE = "<script>window.pwned=1</script> and <b>bold</b> " + "x" * 5000


def _items(n: int, prefix: str = "i") -> list[NewItem]:
    return [NewItem(f"{prefix}{k}", f"{k}+{k}=", f"A says {k}", f"B says {k}", "addition" if k % 2 else "sorting")
            for k in range(n)]


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "review.db"
    store = ReviewStore(path, create=True)
    store.create_session("s1", "runs/sft", "runs/grpo", "test prompts", _items(5), seed=1)
    store.create_session("s2", "runs/sft", "runs/grpo", "test prompts", _items(3, prefix="other"), seed=2)
    store.create_session("hostile", "runs/a", "runs/b", "test", [
        NewItem("h0", [{"role": "system", "content": "<i>sys</i>"}, {"role": "user", "content": "hi"}], HOSTILE,
                "plain", "chat")])
    return path


@pytest.fixture
def runs_root(tmp_path) -> Path:
    """A hand-made run: 3 steps of samples, an alarm at step 2, no config.yaml (so prompts fall back)."""
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    lines = [{"step": 1, "samples": [["0/add:1+1/0", "2", 1.0], ["0/add:1+1/1", "11", 0.0]]},
             {"step": 2, "samples": [["0/add:2+3/0", "5 because HACK", 1.0], ["0/add:2+3/1", "6", 0.0]]},
             {"step": 3, "samples": [["1/add:4+4/0", "8", 1.0], ["1/dir/with/slash/1", "<b>x</b>", 0.5]]}]
    (run / "samples.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    metrics = [{"step": 1, "reward_mean": 0.5}, {"step": 2, "reward_mean": 0.5, "alarm/reward_hacking": 1},
               {"step": 3, "reward_mean": 0.8, "alarm/kl_spike": 0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return tmp_path / "runs"


def _client(db, runs_root=None, reviewer: str | None = "ana", token=None) -> TestClient:
    client = TestClient(make_app(db, token=token, runs_root=runs_root or db.parent / "runs"), follow_redirects=False)
    if reviewer:
        client.cookies.set(REVIEWER_COOKIE, reviewer)
    return client


def _current_item(client, sid: str) -> str:
    page = client.get(f"/s/{sid}")
    assert page.status_code == 200, page.text
    return page.text.split('name="item" value="')[1].split('"')[0]


def test_judging_stores_one_judgment_and_a_double_submit_nothing_new(db):
    client, store = _client(db), ReviewStore(db)
    item_id = _current_item(client, "s1")
    assert _current_item(client, "s1") == item_id  # a reload shows the same claimed item
    done = client.post("/s/s1/judge", data={"item": item_id, "answer": "left", "note": " close call "})
    assert done.status_code == 303 and done.headers["location"] == "/s/s1"
    again = client.post("/s/s1/judge", data={"item": item_id, "answer": "right"})
    assert again.status_code == 303
    [j] = store.judgments("s1")
    item = store.item("s1", item_id)
    assert (j.item, j.reviewer, j.verdict, j.note) == (item_id, "ana", "a" if item.a_left else "b", "close call")
    assert _current_item(client, "s1") != item_id  # never shown again to this reviewer


def test_a_judgment_of_an_item_never_shown_to_the_reviewer_is_refused(db):
    client, store = _client(db), ReviewStore(db)
    shown = _current_item(client, "s1")
    other = next(it.id for it in store.items("s1") if it.id != shown)
    refused = client.post("/s/s1/judge", data={"item": other, "answer": "left"})
    assert refused.status_code == 409 and "was not shown to" in refused.text
    assert store.judgments("s1") == []


def test_review_page_is_blind_and_shows_progress(db):
    client = _client(db)
    page = client.get("/s/s1").text
    assert "runs/sft" not in page and "runs/grpo" not in page
    assert 'data-judged="0" data-needed="' in page and 'data-mine="0"' in page
    results = client.get("/s/s1/results")
    assert results.status_code == 200 and "runs/sft" in results.text and "runs/grpo" in results.text


def test_reviewer_finishes_a_session_and_sees_the_done_page(db):
    client = _client(db)
    for _ in range(3):
        client.post("/s/s2/judge", data={"item": _current_item(client, "s2"), "answer": "tie"})
    page = client.get("/s/s2")
    assert page.status_code == 200 and "data-done" in page.text and "/s/s2/results" in page.text


def test_unknown_session_is_404_with_its_message(db):
    client = _client(db)
    for response in (client.get("/s/nope"), client.post("/s/nope/judge", data={"item": "i0", "answer": "left"}),
                     client.get("/s/nope/results")):
        assert response.status_code == 404
        assert "unknown review session &#39;nope&#39;" in response.text and "Traceback" not in response.text


def test_item_of_another_session_is_404_and_nothing_stored(db):
    client = _client(db)
    response = client.post("/s/s1/judge", data={"item": "other0", "answer": "left"})
    assert response.status_code == 404 and "item &#39;other0&#39; is not in session &#39;s1&#39;" in response.text
    assert ReviewStore(db).judgments("s1") == [] and ReviewStore(db).judgments("s2") == []


@pytest.mark.parametrize("answer", ["a", "best", "", "LEFT"])
def test_bad_answer_is_400_and_nothing_stored(db, answer):
    client = _client(db)
    response = client.post("/s/s1/judge", data={"item": _current_item(client, "s1"), "answer": answer})
    assert response.status_code == 400 and "is not one of left, right, tie, both_bad" in response.text
    assert ReviewStore(db).judgments("s1") == []


@pytest.mark.parametrize("name, message", [("", "reviewer name is empty"), ("   ", "reviewer name is empty"),
                                           ("r" * 200, "reviewer name is 200 characters; at most 100")])
def test_bad_reviewer_name_is_400_and_nothing_stored(db, name, message):
    client = _client(db, reviewer=None)
    response = client.post("/reviewer", data={"name": name})
    assert response.status_code == 400 and message in response.text
    assert REVIEWER_COOKIE not in response.cookies
    client.cookies.set(REVIEWER_COOKIE, name or '""')  # a cookie set by hand is checked too
    judged = client.post("/s/s1/judge", data={"item": "i0", "answer": "left"})
    assert judged.status_code == 400
    assert ReviewStore(db).judgments("s1") == []


def test_name_is_entered_once_and_kept(db):
    client = _client(db, reviewer=None)
    first = client.get("/s/s1")
    assert first.status_code == 303 and first.headers["location"] == "/?next=%2Fs%2Fs1"
    entered = client.post("/reviewer", data={"name": " Zoë Ng ", "next": "/s/s1"})
    assert entered.status_code == 303 and entered.headers["location"] == "/s/s1"
    assert "Zoë Ng" in client.get("/s/s1").text
    offsite = client.post("/reviewer", data={"name": "x", "next": "//evil.example/"})
    assert offsite.headers["location"] == "/"  # never redirected off this server


def test_token_is_required_on_every_request(db):
    client = _client(db, token="s3cret")
    for path in ("/", "/s/s1", "/static/review.css", "/runs"):
        response = client.get(path)
        assert response.status_code == 401 and "token needed" in response.text, path
    assert client.post("/s/s1/judge", data={"item": "i0", "answer": "left"}).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    assert ReviewStore(db).judgments("s1") == []
    assert client.get("/s/s1", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    entered = client.get("/s/s1?token=s3cret&x=1")  # once in the link: a cookie, and the token leaves the URL
    assert entered.status_code == 303 and entered.headers["location"] == "/s/s1?x=1"
    assert client.cookies.get(TOKEN_COOKIE) == "s3cret"
    assert client.get("/s/s1").status_code == 200


def test_hostile_output_comes_back_escaped(db):
    page = _client(db).get("/s/hostile").text
    assert "<script>window.pwned" not in page and "<b>bold</b>" not in page and "<i>sys</i>" not in page
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "x" * 5000 in page  # the long line is all there (the CSS wraps it; the browser test measures that)
    assert '<span class="role">system</span>' in page and "&lt;i&gt;sys&lt;/i&gt;" in page


def test_static_assets_are_local(db):
    client = _client(db)
    page = client.get("/").text
    assert "http://" not in page and "https://" not in page
    css, js = client.get("/static/review.css"), client.get("/static/review.js")
    assert css.status_code == js.status_code == 200
    assert "pre-wrap" in css.text and "overflow-wrap: anywhere" in css.text and "requestSubmit" in js.text


@pytest.mark.parametrize("run", ["../", "../../etc", "/etc", "tiny/../../x", "nothere"])
def test_runs_outside_the_root_or_missing_are_refused(db, runs_root, run):
    response = _client(db, runs_root).get("/runs", params={"run": run})
    assert response.status_code in (400, 404) and "Traceback" not in response.text
    if run != "nothere":
        assert response.status_code == 400 and "outside the runs root" in response.text
    flagged = _client(db, runs_root).post("/runs/flag", data={"run": run, "step": "1", "sample_id": "x", "kind": "good"})
    assert flagged.status_code in (400, 404)
    assert ReviewStore(db).flags() == []


def test_sample_browser_filters_and_flags(db, runs_root):
    client = _client(db, runs_root)
    listing = client.get("/runs")
    assert listing.status_code == 200 and "?run=tiny" in listing.text
    page = client.get("/runs", params={"run": "tiny", "q": "hack"})
    assert page.status_code == 200 and 'data-matched="1"' in page.text and "prompts unavailable" in page.text
    assert "&lt;b&gt;x&lt;/b&gt;" in client.get("/runs", params={"run": "tiny", "step": "3"}).text
    assert client.get("/runs", params={"run": "tiny", "step": "x"}).status_code == 400
    back = "/runs?run=tiny&q=hack"
    flagged = client.post("/runs/flag", data={"run": "tiny", "step": "2", "sample_id": "0/add:2+3/0",
                                              "kind": "reward_hacked", "note": "says HACK", "back": back})
    assert flagged.status_code == 303 and flagged.headers["location"] == back
    [f] = ReviewStore(db).flags()
    assert (f.step, f.sample_id, f.kind, f.note, f.output, f.reward, f.reviewer) == (
        2, "0/add:2+3/0", "reward_hacked", "says HACK", "5 because HACK", 1.0, "ana")
    assert 'data-flag="reward_hacked"' in client.get(back).text
    bad_kind = client.post("/runs/flag", data={"run": "tiny", "step": "2", "sample_id": "0/add:2+3/0", "kind": "meh"})
    unknown = client.post("/runs/flag", data={"run": "tiny", "step": "9", "sample_id": "0/add:2+3/0", "kind": "good"})
    assert (bad_kind.status_code, unknown.status_code) == (400, 404) and len(ReviewStore(db).flags()) == 1


# ------------------------------------------------------------ run_samples: pure reading and filtering


def test_read_samples_and_alarm_steps(runs_root):
    run_dir, name = run_samples.resolve_run_dir(runs_root, "tiny")
    samples, notes = run_samples.read_samples(run_dir)
    assert name == "tiny" and notes == [] and len(samples) == 6
    assert samples[2] == run_samples.Sample(2, "0/add:2+3/0", "5 because HACK", 1.0)
    assert run_samples.alarm_steps(run_dir) == {2: ["reward_hacking"]}  # a zero alarm did not fire
    assert run_samples.list_runs(runs_root) == ["tiny"]


def test_half_written_last_line_is_skipped_with_a_note(runs_root):
    path = runs_root / "tiny" / "samples.jsonl"
    path.write_text(path.read_text() + '{"step": 4, "samples": [["0/a')
    samples, notes = run_samples.read_samples(runs_root / "tiny")
    assert len(samples) == 6 and "incomplete" in notes[0]


def test_filters(runs_root):
    samples, _ = run_samples.read_samples(runs_root / "tiny")
    alarms = {2: ["reward_hacking"]}

    def ids(**query):
        return [s.sample_id for s in run_samples.filter_samples(samples, run_samples.parse_filter(query), alarms)]

    assert ids() == [s.sample_id for s in samples]
    assert ids(step="3") == ["1/add:4+4/0", "1/dir/with/slash/1"]
    assert ids(step="1-2") == ["0/add:1+1/0", "0/add:1+1/1", "0/add:2+3/0", "0/add:2+3/1"]
    assert ids(step="2-") == ids(step="2-3") and ids(step="-1") == ids(step="1")
    assert ids(reward_min="0.5", reward_max="0.9") == ["1/dir/with/slash/1"]
    assert ids(reward_min="1") == ["0/add:1+1/0", "0/add:2+3/0", "1/add:4+4/0"]
    assert ids(alarms="1") == ["0/add:2+3/0", "0/add:2+3/1"]
    assert ids(q="HaCk") == ["0/add:2+3/0"] and ids(q="4+4") == ["1/add:4+4/0"]
    assert ids(alarms="1", reward_max="0") == ["0/add:2+3/1"]
    with pytest.raises(Exception, match="give one step"):
        run_samples.parse_filter({"step": "a-b"})
    with pytest.raises(Exception, match="reward_min='x' is not a number"):
        run_samples.parse_filter({"reward_min": "x"})


def test_pages_and_problem_ids():
    rows = list(range(120))
    assert run_samples.page_of(rows, 1, 50)[1:] == (1, 3) and run_samples.page_of(rows, 3, 50)[0] == list(range(100, 120))
    assert run_samples.page_of(rows, 99, 50)[1] == 3 and run_samples.page_of([], 1, 50) == ([], 1, 1)
    assert run_samples.problem_id_of("0/add:336+729/3") == "add:336+729"
    assert run_samples.problem_id_of("2/dir/with/slash/1") == "dir/with/slash"


def test_prompt_lookup_rebuilds_the_task_from_the_config(tmp_path):
    from posttrain.config import dump_config, load_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(load_config(None, ["task.train_size=50", "task.heldout_size=10"])))
    from posttrain.tasks import load_task

    cfg = load_config(run / "config.yaml")
    problem = load_task(cfg.task, cfg.seed).train[3]
    lookup, note = run_samples.prompt_lookup(run)
    assert note == "" and lookup(f"0/{problem.id}/5") == problem.prompt and lookup("0/nope/1") == ""
    (run / "config.yaml").write_text("task: {name: dataset, path: /no/such/file.jsonl}\n")
    lookup, note = run_samples.prompt_lookup(run)
    assert lookup(f"0/{problem.id}/5") == "" and note.startswith("prompts unavailable")


def test_results_page_renders_the_statistics(db, monkeypatch):
    """Against the shape `posttrain.review.results.session_results` returns (a stand-in here, so the page is tested
    on its own): win rate with CI, per source, kappa not yet defined, a scorer row."""
    import posttrain.review.app as app_module

    stats = {"session": "s1", "a_model": "runs/sft", "b_model": "runs/grpo", "items": 5, "judgments": 4,
             "win_rate": {"b_over_a": 0.625, "ci_low": 0.3, "ci_high": 0.9, "n": 4}, "ties": 1, "both_bad": 0,
             "by_source": [{"source": "addition", "n": 2, "b_over_a": 0.75, "ci_low": 0.2, "ci_high": 1.0, "both_bad": 0},
                           {"source": "<sorting>", "n": 2, "b_over_a": None, "ci_low": None, "ci_high": None, "both_bad": 1}],
             "agreement": {"kappa": None, "observed": None, "n_pairs": 0},
             "scorers": [{"scorer": "rm:runs/rm", "agree": 0.5, "ci_low": 0.1, "ci_high": 0.9, "n": 4}]}
    monkeypatch.setattr(app_module, "session_results", lambda store, sid: stats)
    page = _client(db).get("/s/s1/results")
    assert page.status_code == 200, page.text
    assert 'data-win-rate="0.625"' in page.text and "62.5%" in page.text and "[30.0%, 90.0%]" in page.text
    assert "&lt;sorting&gt;" in page.text and "No doubly reviewed item has two judgments yet" in page.text
    assert 'data-scorer="rm:runs/rm"' in page.text and "50.0%" in page.text


def test_results_page_counts_real_judgments(db):
    """Two reviewers prefer B on every item they see: the page shows a 100% win rate from the real statistics."""
    store = ReviewStore(db)
    for name in ("ana", "bo"):
        client = _client(db, reviewer=name)
        while "data-done" not in (page := client.get("/s/s1")).text:
            item = store.item("s1", page.text.split('name="item" value="')[1].split('"')[0])
            client.post("/s/s1/judge", data={"item": item.id, "answer": "right" if item.a_left else "left"})
    page = _client(db).get("/s/s1/results").text
    assert 'data-win-rate="1.0"' in page and re.search(r"data-ci>\[\d+\.\d%, 100\.0%\]", page)
    assert "observed agreement 100.0% over 1 doubly reviewed item(s)" in page
    assert "6 of 6 (5 items)" in page
