"""The review web app: blind pairwise review of two checkpoints, its results, and a run's sample browser with flags.

Starlette with server-rendered Jinja2 templates (autoescape on: every prompt and output is untrusted model text)
and one local CSS and JS file; nothing is loaded from another host. State lives in the ReviewStore (SQLite); the
app keeps only caches of run files. The reviewer's name is a cookie, entered once. With a token, every request
must carry it (see `TokenGate`).

    app = make_app("review.db", token=None, runs_root="runs")   # served by server.run_server
"""

from __future__ import annotations

import hmac
from functools import partial
from pathlib import Path
from urllib.parse import quote, unquote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from posttrain.errors import PosttrainError
from posttrain.review import run_samples
from posttrain.review.results import session_results
from posttrain.review.store import ReviewInputError, ReviewStore, check_reviewer

HERE = Path(__file__).parent
REVIEWER_COOKIE = "posttrain_reviewer"
TOKEN_COOKIE = "posttrain_token"
ANSWERS = ("left", "right", "tie", "both_bad")  # what the review page's four buttons send
CACHED_RUNS = 4  # runs whose samples stay in memory (a long run's samples.jsonl holds tens of thousands)
FLAG_LABELS = {"reward_hacked": "reward hacked", "wrong_but_rewarded": "wrong but rewarded", "good": "good"}


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)  # a typo in a template is an error, not blank text
    env.globals["FLAG_LABELS"] = FLAG_LABELS
    return Jinja2Templates(env=env)


class TokenGate:
    """ASGI middleware: with a token set, a request passes only with `Authorization: Bearer T`, the token cookie, or
    `?token=T` (which sets the cookie and redirects to the same URL without it, so the token leaves the address
    bar). Anything else is a 401 page. Compared with hmac.compare_digest: no timing side channel."""

    def __init__(self, app, token: str):
        self.app = app
        self.token = token.encode()

    def _ok(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        auth = request.headers.get("authorization", "")
        if self._ok(auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None) \
                or self._ok(request.cookies.get(TOKEN_COOKIE)):
            return await self.app(scope, receive, send)
        if self._ok(request.query_params.get("token")):
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
            # Lax: sent on a link followed from chat, never on another site's form POST (no cross-site judgments).
            response.set_cookie(TOKEN_COOKIE, self.token.decode(), httponly=True, samesite="lax")
            return await response(scope, receive, send)
        response = HTMLResponse(
            "<!doctype html><title>401 token needed</title><h1>401: token needed</h1><p>This review server needs its "
            "token: open the link with <code>?token=...</code> once, or send <code>Authorization: Bearer ...</code>. "
            "Ask whoever started <code>posttrain review serve</code> for it.</p>", status_code=401)
        return await response(scope, receive, send)


class ReviewApp:
    """The routes; one instance per app, holding the store and the caches of run files."""

    def __init__(self, db_path: str | Path, runs_root: str | Path):
        # create=True: a fresh server with no session yet can still browse runs and store flags.
        self.store = ReviewStore(db_path, create=True)
        self.runs_root = Path(runs_root)
        self.templates = _templates()
        self._samples: dict[Path, tuple[tuple, list, list, dict]] = {}  # run dir -> (file stamp, samples, notes, alarms)
        self._prompts: dict[Path, tuple[tuple, object, str]] = {}  # run dir -> (config stamp, lookup, note)

    def render(self, request: Request, name: str, status: int = 200, **context) -> HTMLResponse:
        context.setdefault("reviewer", self.reviewer(request))
        context["status"] = status
        return self.templates.TemplateResponse(request, name, context, status_code=status)

    @staticmethod
    def reviewer(request: Request) -> str | None:
        raw = request.cookies.get(REVIEWER_COOKIE)
        return unquote(raw) if raw else None

    # ------------------------------------------------------------ reviewer and sessions

    async def index(self, request: Request):
        sessions = await run_in_threadpool(self.store.sessions)
        reviewer = self.reviewer(request)
        rows = [(s, await run_in_threadpool(self.store.progress, s.id, reviewer)) for s in sessions]
        return self.render(request, "index.html", rows=rows, db=self.store.path, next=_local(request.query_params.get("next")),
                           runs=run_samples.list_runs(self.runs_root))

    async def set_reviewer(self, request: Request):
        form = await request.form()
        name = check_reviewer(form.get("name"))
        response = RedirectResponse(_local(form.get("next")) or "/", status_code=303)
        # quoted: a name may hold spaces or non-ASCII, which a raw cookie value cannot
        response.set_cookie(REVIEWER_COOKIE, quote(name), max_age=365 * 86400, samesite="lax")
        return response

    async def review(self, request: Request):
        sid = request.path_params["sid"]
        session = await run_in_threadpool(self.store.session, sid)  # 404 for an unknown session
        reviewer = self.reviewer(request)
        if not reviewer:
            return RedirectResponse("/?" + urlencode({"next": f"/s/{sid}"}), status_code=303)
        item = await run_in_threadpool(self.store.next_item, sid, reviewer)
        progress = await run_in_threadpool(self.store.progress, sid, reviewer)
        if item is None:
            return self.render(request, "done.html", session=session, progress=progress)
        return self.render(request, "review.html", session=session, item=item, progress=progress)

    async def judge(self, request: Request):
        sid = request.path_params["sid"]
        await run_in_threadpool(self.store.session, sid)
        reviewer = check_reviewer(self.reviewer(request) or "")
        form = await request.form()
        item = await run_in_threadpool(self.store.item, sid, str(form.get("item", "")))  # 404: not this session's
        answer = form.get("answer")
        if answer not in ANSWERS:
            raise ReviewInputError(f"answer {answer!r} is not one of {', '.join(ANSWERS)}")
        # The store's answer wins on a double submit (judge returns False); either way, on to the next item.
        await run_in_threadpool(partial(self.store.judge, require_claim=True), sid, item.id, reviewer,
                                item.verdict_of(answer), str(form.get("note", ""))[:2000])
        return RedirectResponse(f"/s/{quote(sid)}", status_code=303)

    async def results(self, request: Request):
        sid = request.path_params["sid"]
        session = await run_in_threadpool(self.store.session, sid)
        progress = await run_in_threadpool(self.store.progress, sid, None)
        stats = await run_in_threadpool(session_results, self.store, sid)
        return self.render(request, "results.html", session=session, progress=progress, stats=stats)

    # ------------------------------------------------------------ the sample browser

    def _run_data(self, run_dir: Path):
        """(samples, notes, alarms, prompt lookup, prompt note), re-read only when the run's files change."""
        stamp = tuple((p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None
                      for p in (run_dir / "samples.jsonl", run_dir / "metrics.jsonl"))
        cached = self._samples.get(run_dir)
        if cached is None or cached[0] != stamp:
            samples, notes = run_samples.read_samples(run_dir)
            if len(self._samples) >= CACHED_RUNS and run_dir not in self._samples:
                self._samples.pop(next(iter(self._samples)))  # the run read longest ago
            cached = self._samples[run_dir] = (stamp, samples, notes, run_samples.alarm_steps(run_dir))
        config = run_dir / "config.yaml"
        cstamp = (config.stat().st_mtime_ns,) if config.exists() else ()
        prompts = self._prompts.get(run_dir)
        if prompts is None or prompts[0] != cstamp:
            prompts = self._prompts[run_dir] = (cstamp, *run_samples.prompt_lookup(run_dir))
        return cached[1], cached[2], cached[3], prompts[1], prompts[2]

    async def runs(self, request: Request):
        q = request.query_params
        if not q.get("run"):
            return self.render(request, "runs.html", runs=run_samples.list_runs(self.runs_root),
                               root=self.runs_root.resolve(), run=None)
        run_dir, name = run_samples.resolve_run_dir(self.runs_root, q["run"])
        filt = run_samples.parse_filter(dict(q))
        samples, notes, alarms, prompt_of, prompt_note = await run_in_threadpool(self._run_data, run_dir)
        shown = run_samples.filter_samples(samples, filt, alarms)
        page = int(q["page"]) if q.get("page", "").isdigit() else 1
        rows, page, pages = run_samples.page_of(shown, page)
        flags = {}
        for f in await run_in_threadpool(self.store.flags, str(run_dir)):
            flags.setdefault((f.step, f.sample_id), []).append(f)
        keep = {k: v for k, v in q.items() if k not in ("page",) and v}
        return self.render(request, "runs.html", run=name, root=self.runs_root.resolve(), filt=filt, q=keep,
                           rows=[(s, prompt_of(s.sample_id)) for s in rows], total=len(samples), matched=len(shown),
                           page=page, pages=pages, alarms=alarms, notes=notes + ([prompt_note] if prompt_note else []),
                           flags=flags, page_url=lambda n: "/runs?" + urlencode({**keep, "page": n}))

    async def flag(self, request: Request):
        reviewer = check_reviewer(self.reviewer(request) or "")
        form = await request.form()
        run_dir, name = run_samples.resolve_run_dir(self.runs_root, str(form.get("run", "")))
        step_raw = str(form.get("step", ""))
        if not step_raw.isdigit():
            raise ReviewInputError(f"step {step_raw!r} is not a whole number")
        sample = await run_in_threadpool(run_samples.find_sample, run_dir, int(step_raw), str(form.get("sample_id", "")))
        prompt_of = (await run_in_threadpool(self._run_data, run_dir))[3]
        await run_in_threadpool(lambda: self.store.flag(
            str(run_dir), sample.step, sample.sample_id, reviewer, str(form.get("kind", "")),
            note=str(form.get("note", ""))[:2000], prompt=prompt_of(sample.sample_id), output=sample.text,
            reward=sample.reward))
        back = _local(str(form.get("back", ""))) or "/runs?" + urlencode({"run": name})
        return RedirectResponse(back, status_code=303)

    # ------------------------------------------------------------ errors: a page with the message, never a traceback

    async def input_error(self, request: Request, exc: ReviewInputError):
        return self.render(request, "error.html", status=exc.status, message=str(exc))

    async def posttrain_error(self, request: Request, exc: PosttrainError):
        return self.render(request, "error.html", status=400, message=str(exc))

    async def http_error(self, request: Request, exc: HTTPException):
        message = "no such page" if exc.status_code == 404 else str(exc.detail)
        return self.render(request, "error.html", status=exc.status_code, message=message)


def _local(url) -> str | None:
    """`url` when it is a path on this server (after a name is entered, a form goes back there); None for anything
    else, so a crafted link cannot redirect a reviewer to another site."""
    url = str(url or "")
    return url if url.startswith("/") and not url.startswith("//") and "\\" not in url else None


def make_app(db_path: str | Path, *, token: str | None = None, runs_root: str | Path = "runs"):
    """The ASGI app over the review database at `db_path` (created when missing). `token`: required on every
    request (see TokenGate). `runs_root`: the only directory whose runs the sample browser reads."""
    view = ReviewApp(db_path, runs_root)
    routes = [
        Route("/", view.index),
        Route("/reviewer", view.set_reviewer, methods=["POST"]),
        Route("/s/{sid}", view.review),
        Route("/s/{sid}/judge", view.judge, methods=["POST"]),
        Route("/s/{sid}/results", view.results),
        Route("/runs", view.runs),
        Route("/runs/flag", view.flag, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={
        ReviewInputError: view.input_error, PosttrainError: view.posttrain_error, HTTPException: view.http_error})
    app.state.review = view
    return TokenGate(app, token) if token else app
