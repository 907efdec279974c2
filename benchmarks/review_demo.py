"""A review session labelled through the browser by two scripted reviewers: the demo's SFT model (A) against its
GRPO checkpoint (B) on the built-in addition suite, then the win rate and the built-in proxy reward model's
agreement with the reviewers.

    make demo && posttrain rm pairs && posttrain rm train        # runs/demo/... and runs/rm/model
    python benchmarks/review_demo.py --b runs/demo/checkpoints/step_000400/model

The reviewers stand in for people whose taste is the addition task's hidden gold function (rewards/gold.py): the
output with the higher gold score is better, equal scores are a tie, and two outputs that both miss the answer by
more than half its digits are "both bad". Reviewer 2 answers at random on `--noise` of the items, so the agreement
between the two (Cohen's kappa on the doubly reviewed items) is below 1 as it is between people. They press the
keys 1-4 in a real Chromium, as a person would; the results are `posttrain review results`'s, written to
benchmarks/results/review_demo.json, and the screenshots of the review screen and the results page go to docs/.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common import write_json

REPO = Path(__file__).resolve().parents[1]
ANSWER_KEYS = {"left": "1", "right": "2", "tie": "3", "both_bad": "4"}


def gold_answer(prompt: str, left: str, right: str) -> str:
    """The scripted reviewer's answer for an addition prompt 'a+b=' (left / right / tie / both_bad)."""
    from posttrain.rewards.gold import addition_gold

    a, b = (int(x) for x in re.fullmatch(r"\s*(\d+)\+(\d+)=\s*", prompt).groups())
    gl, gr = addition_gold(str(a + b), left), addition_gold(str(a + b), right)
    if max(gl, gr) < 0.5:
        return "both_bad"
    if abs(gl - gr) < 1e-9:
        return "tie"
    return "left" if gl > gr else "right"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def posttrain(*args: str) -> None:
    print("$ posttrain " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "posttrain.cli", *args], check=True, cwd=REPO)


def wait_for(url: str, seconds: float = 60.0) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the review server did not answer at {url}")


def label(page, base: str, session: str, reviewer: str, rng: random.Random, noise: float,
          screenshot: Path | None = None) -> int:
    """Labels items as `reviewer` until nothing is left for them; returns how many they judged. With `screenshot`,
    the review screen is captured at the item where the two outputs first differ."""
    page.goto(f"{base}/")
    page.fill("input[name=name]", reviewer)
    page.click("form[action='/reviewer'] button")
    page.goto(f"{base}/s/{session}")
    done = 0
    while page.locator("[data-done]").count() == 0:
        prompt = page.inner_text("[data-prompt]")
        left = page.inner_text(".output[data-side=left]")
        right = page.inner_text(".output[data-side=right]")
        answer = gold_answer(prompt, left, right)
        if rng.random() < noise:
            answer = rng.choice(list(ANSWER_KEYS))
        item = page.get_attribute("#judge", "data-item")
        if screenshot is not None and left != right:
            page.screenshot(path=str(screenshot))
            screenshot = None
        page.keyboard.press(ANSWER_KEYS[answer])
        page.wait_for_function(f"() => !document.querySelector('#judge') || "
                               f"document.querySelector('#judge').dataset.item !== {json.dumps(item)}")
        done += 1
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="runs/demo/sft-model")
    ap.add_argument("--b", required=True, help="the GRPO checkpoint's model directory")
    ap.add_argument("--rm", default="runs/rm/model")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--db", default="reviews/demo.db")
    ap.add_argument("--session", default="demo-sft-vs-grpo")
    ap.add_argument("--out", default="benchmarks/results/review_demo.json")
    ap.add_argument("--screenshots", default="docs")
    args = ap.parse_args()

    db = REPO / args.db
    db.unlink(missing_ok=True)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    start = time.perf_counter()
    posttrain("review", "new", "--a", args.a, "--b", args.b, "--prompts", "addition", "--n", str(args.n),
              "--name", args.session, "--db", str(db))
    generated = time.perf_counter() - start

    from playwright.sync_api import sync_playwright

    chromium = subprocess.run(["bash", str(REPO / "scripts" / "install_browser.sh")], capture_output=True, text=True,
                              check=True).stdout.strip().splitlines()[-1]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "posttrain.cli", "review", "serve", "--db", str(db), "--port",
                               str(port)], cwd=REPO)
    try:
        wait_for(base + "/")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            pages = [browser.new_context(viewport={"width": 1100, "height": 560}).new_page() for _ in range(2)]
            t0 = time.perf_counter()
            shots = REPO / args.screenshots
            counts = [label(pages[0], base, args.session, "gold-1", random.Random(1), 0.0,
                            shots / "review-screen.png"),
                      label(pages[1], base, args.session, "gold-2", random.Random(2), args.noise)]
            labelled = time.perf_counter() - t0
            posttrain("review", "results", args.session, "--db", str(db), "--rm", args.rm, "--json", args.out)
            view = browser.new_context(viewport={"width": 1100, "height": 640}).new_page()
            view.goto(f"{base}/s/{args.session}/results")
            view.screenshot(path=str(shots / "review-results.png"), full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    doc = json.loads((REPO / args.out).read_text())
    doc["scripted"] = {"a": args.a, "b": args.b, "n": args.n, "noise_reviewer_2": args.noise,
                       "judged": {"gold-1": counts[0], "gold-2": counts[1]},
                       "generate_seconds": generated, "label_seconds": labelled}
    write_json(REPO / args.out, doc, end="")
    print(json.dumps({k: doc[k] for k in ("win_rate", "ties", "both_bad", "agreement", "scorers")}, indent=1))


if __name__ == "__main__":
    main()
