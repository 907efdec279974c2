"""The review page in a real browser: Debian's chromium (scripts/install_browser.sh, never downloaded by playwright)
against the server started as a real process (`python -m posttrain.review.server`). Sessions are built directly in
the store with synthetic outputs (no model). Covers: keyboard-only labelling, two reviewers at once, SIGKILL and
restart with no judgment lost, hostile model text rendered inert and wrapped, the token off loopback, and flagging
in the sample browser."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from posttrain.review.store import NewItem, ReviewStore

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "<script>window.pwned=1</script>\n<b>bold</b> <img src=x onerror=\"window.pwned=2\">\n" + "y" * 5000
KEYS = "1234"  # left better, right better, tie, both bad
ANSWER_OF_KEY = {"1": "left", "2": "right", "3": "tie", "4": "both_bad"}


def _items(n: int) -> list[NewItem]:
    """Addition prompts with a plausible pair of answers each (the screenshot shows one)."""
    out = []
    for k in range(n):
        a, b = 17 + 13 * k, 48 + 7 * k
        out.append(NewItem(f"q{k:02d}", [{"role": "user", "content": f"What is {a} + {b}? Show your working."}],
                           f"{a} + {b}: add the ones, carry the tens.\nThe answer is {a + b}.",
                           f"{a} + {b} = {a + b + (k % 3 == 0)}", "addition" if k % 4 else "held-out"))
    return out


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("review") / "review.db"
    store = ReviewStore(path, create=True)
    store.create_session("keyboard", "runs/demo/sft-model", "runs/demo/step_30", "addition", _items(25), double_share=0)
    store.create_session("pair", "sft", "grpo", "addition", _items(25), double_share=0.2, seed=3)
    store.create_session("kill", "sft", "grpo", "addition", _items(10), double_share=0, seed=4)
    store.create_session("hostile", "a", "b", "test", [
        NewItem("h", "<i>prompt</i> " + "p" * 3000, HOSTILE, "fine", "test")], double_share=0)
    return path


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    """A hand-made run: samples.jsonl and metrics.jsonl only (no config.yaml: prompts fall back to empty)."""
    root = tmp_path_factory.mktemp("runs")
    (root / "tiny").mkdir()
    lines = [{"step": s, "samples": [[f"0/add:{s}+{j}/{j}", f"{s + j}" + (" trust me" if (s, j) == (2, 1) else ""),
                                      1.0 if j % 2 else 0.0] for j in range(4)]} for s in (1, 2, 3)]
    (root / "tiny" / "samples.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    (root / "tiny" / "metrics.jsonl").write_text(json.dumps({"step": 2, "alarm/reward_hacking": 1}) + "\n")
    return root


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Server:
    """`python -m posttrain.review.server` as a child process, waited for until it accepts connections."""

    def __init__(self, db: Path, runs_root: Path, *extra: str, host: str = "127.0.0.1"):
        self.host, self.port = host, _free_port(host)
        self.log = db.parent / f"server-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "posttrain.review.server", "--db", str(db), "--host", host, "--port", str(self.port),
             "--runs-root", str(runs_root), *extra], stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()}"
            try:
                socket.create_connection((host, self.port), timeout=0.5).close()
                break
            except OSError:
                assert time.time() < deadline, f"server did not listen within 30 s:\n{self.log.read_text()}"
                time.sleep(0.1)
        self.url = f"http://{host}:{self.port}"

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(db, runs_root):
    s = Server(db, runs_root)
    yield s
    s.stop()


def _reviewer_page(browser, url: str, name: str):
    """A fresh browser context whose reviewer enters their name once on the front page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(url + "/")
    page.fill("input[name=name]", name)
    with page.expect_navigation():
        page.press("input[name=name]", "Enter")
    assert page.locator("[data-reviewer]").inner_text() == name
    return context, page


SHOWN_JS = """() => {
  if (document.querySelector('[data-done]')) return null;
  const bar = document.querySelector('.progress');
  return {item: document.querySelector('form#judge').dataset.item, mine: +bar.dataset.mine, judged: +bar.dataset.judged,
          needed: +bar.dataset.needed, bar: bar.querySelector('progress').value};
}"""


def _shown(page) -> dict | None:
    """The item on screen and the progress bar's numbers (one round trip); None on the done page."""
    return page.evaluate(SHOWN_JS)


def _press(page, key: str) -> None:
    with page.expect_navigation():
        page.keyboard.press(key)


def test_a_reviewer_labels_20_items_by_keyboard(browser, server, db):
    store = ReviewStore(db)
    context, page = _reviewer_page(browser, server.url, "ana")
    page.goto(f"{server.url}/s/keyboard")
    pressed = {}
    for n in range(20):
        shown = _shown(page)
        assert shown["mine"] == shown["judged"] == shown["bar"] == n and shown["needed"] == 25
        assert shown["item"] not in pressed, "an item came back after it was judged"
        assert "runs/demo" not in page.content()  # blind: no model path on the review page
        pressed[shown["item"]] = KEYS[(n * 7) % 4]
        if n == 0:  # n opens the note; digits typed there are text, not answers; Esc leaves it
            page.keyboard.press("n")
            page.keyboard.type("off by 1 in 2 places")
            page.keyboard.press("Escape")
            assert _shown(page)["item"] == shown["item"]
        _press(page, pressed[shown["item"]])
    assert _shown(page)["mine"] == 20
    judgments = store.judgments("keyboard")
    assert len(judgments) == 20 and {j.reviewer for j in judgments} == {"ana"}
    for j in judgments:  # the stored A/B verdict is what the pressed left/right meant for that item's order
        assert j.verdict == store.item("keyboard", j.item).verdict_of(ANSWER_OF_KEY[pressed[j.item]])
    assert [j.note for j in judgments if j.note] == ["off by 1 in 2 places"]
    context.close()


def test_two_reviewers_at_once(browser, server, db):
    store = ReviewStore(db)
    pages = {name: _reviewer_page(browser, server.url, name) for name in ("bo", "cy")}
    seen = {name: [] for name in pages}
    for _, page in pages.values():
        page.goto(f"{server.url}/s/pair")
    active = set(pages)
    while active:  # interleaved: one answer each in turn
        for name in sorted(active):
            page = pages[name][1]
            shown = _shown(page)
            if shown is None:
                active.discard(name)
                continue
            assert shown["item"] not in seen[name], f"{name} was shown {shown['item']} twice"
            seen[name].append(shown["item"])
            _press(page, KEYS[(len(seen[name]) * (1 if name == "bo" else 3)) % 4])
    items = store.items("pair")
    counts = Counter(j.item for j in store.judgments("pair"))
    assert sum(counts.values()) == sum(it.copies for it in items) == 30  # 25 items, 5 of them for two reviewers
    for it in items:
        assert counts[it.id] == it.copies, it.id
        if it.copies == 2:
            assert it.id in seen["bo"] and it.id in seen["cy"]
    assert set(seen["bo"]).isdisjoint(seen["cy"]) or all(store.item("pair", i).copies == 2
                                                         for i in set(seen["bo"]) & set(seen["cy"]))
    # a reward model's scores, as `posttrain review results --rm` stores them: it prefers the longer output
    store.save_scores("pair", "rm:runs/demo/rm", {it.id: (len(it.output_a), len(it.output_b)) for it in items})
    results = pages["bo"][1]
    results.goto(f"{server.url}/s/pair/results")
    assert results.locator("[data-model=a]").inner_text() == "sft"  # identities shown once the judging is done
    assert "doubly reviewed item(s)" in results.locator("[data-kappa]").inner_text()
    assert results.locator("[data-judgments]").inner_text() == "30 of 30 (25 items)"
    assert results.locator('[data-scorer="rm:runs/demo/rm"]').count() == 1
    for context, _ in pages.values():
        context.close()


def test_sigkill_mid_session_loses_no_judgment(browser, db, runs_root):
    store = ReviewStore(db)
    first = Server(db, runs_root)
    context, page = _reviewer_page(browser, first.url, "dee")
    page.goto(f"{first.url}/s/kill")
    for key in "1234":
        _press(page, key)
    before = store.judgments("kill")
    assert len(before) == 4
    first.stop(signal.SIGKILL)
    assert first.proc.returncode == -signal.SIGKILL
    second = Server(db, runs_root)
    try:
        assert store.judgments("kill") == before  # every submitted judgment intact, verdicts and notes included
        page.goto(f"{second.url}/s/kill")  # the cookie is per host, not per port: the name is still known
        shown = _shown(page)
        assert shown["mine"] == 4 and shown["item"] not in {j.item for j in before}
        _press(page, "2")
        assert len(store.judgments("kill")) == 5 and _shown(page)["mine"] == 5
    finally:
        second.stop()
        context.close()


def test_hostile_output_is_inert_text_and_wraps(browser, server):
    context, page = _reviewer_page(browser, server.url, "eve")
    page.goto(f"{server.url}/s/hostile")
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator(".output b, .output img, .output script, [data-prompt] i").count() == 0
    text = page.locator(".output").all_inner_texts()
    assert any(t.startswith("<script>window.pwned=1</script>\n<b>bold</b> <img") for t in text)
    boxes = page.evaluate("Array.from(document.querySelectorAll('.output, [data-prompt] .text, [data-prompt]'))"
                          ".map(e => [e.scrollWidth, e.clientWidth])")
    assert boxes and all(sw <= cw + 1 for sw, cw in boxes), boxes  # the 5000-character line wraps in its box
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    context.close()


def test_a_server_off_loopback_needs_its_token(browser, db, runs_root):
    refused = subprocess.run([sys.executable, "-m", "posttrain.review.server", "--db", str(db), "--host", "127.0.0.2",
                              "--port", str(_free_port())], capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "POSTTRAIN_REVIEW_TOKEN"})
    assert refused.returncode == 2 and "--token" in refused.stderr and "POSTTRAIN_REVIEW_TOKEN" in refused.stderr
    token = "tok-3f9a"
    exposed = Server(db, runs_root, "--token", token, host="127.0.0.2")
    try:
        with pytest.raises(urllib.error.HTTPError) as no_token:
            urllib.request.urlopen(f"{exposed.url}/s/keyboard", timeout=10)
        assert no_token.value.code == 401 and b"token needed" in no_token.value.read()
        with urllib.request.urlopen(urllib.request.Request(
                f"{exposed.url}/", headers={"Authorization": f"Bearer {token}"}), timeout=10) as ok:
            assert ok.status == 200
        context = browser.new_context()
        page = context.new_page()
        assert page.goto(f"{exposed.url}/").status == 401
        page.goto(f"{exposed.url}/?token={token}")  # once: the cookie carries it from then on
        assert page.url == f"{exposed.url}/" and page.locator("input[name=name]").count() == 1
        assert page.goto(f"{exposed.url}/s/keyboard").status == 200  # on to the name form: no 401
        context.close()
    finally:
        exposed.stop()


def test_sample_browser_filters_and_flags(browser, server, db):
    context, page = _reviewer_page(browser, server.url, "fay")
    page.goto(f"{server.url}/runs")
    with page.expect_navigation():
        page.click("text=tiny")
    assert page.locator("tr[data-sample]").count() == 12
    assert "prompts unavailable" in page.locator("[data-note]").inner_text()
    page.fill("input[name=q]", "trust me")
    with page.expect_navigation():
        page.click("form.filters button")
    rows = page.locator("tr[data-sample]")
    assert rows.count() == 1 and rows.get_attribute("data-sample") == "0/add:2+1/1"
    assert rows.locator(".alarm").count() == 1  # step 2 raised an alarm
    rows.locator("input[name=note]").fill("claims without working")
    with page.expect_navigation():
        rows.locator("button[value=reward_hacked]").click()
    assert "q=trust+me" in page.url and page.locator("[data-flag=reward_hacked]").count() == 1
    [flag] = ReviewStore(db).flags()
    assert (flag.step, flag.sample_id, flag.kind, flag.note, flag.output, flag.reward, flag.reviewer) == (
        2, "0/add:2+1/1", "reward_hacked", "claims without working", "3 trust me", 1.0, "fay")
    context.close()
