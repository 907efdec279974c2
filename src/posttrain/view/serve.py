"""Serves a run's page on 127.0.0.1 and rebuilds it when the run's files change, so a browser left open on a run
in progress follows it (the page reloads itself until summary.json appears)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from posttrain.view.data import read_run
from posttrain.view.page import write_page

WATCHED = ("metrics.jsonl", "samples.jsonl", "summary.json", "config.yaml", "checkpoints")


def _signature(run_dir: Path) -> tuple:
    out = []
    for name in WATCHED:
        p = run_dir / name
        st = p.stat() if p.exists() else None
        out.append((name, st.st_mtime_ns, st.st_size) if st else (name, None, None))
    return tuple(out)


class PageBuilder:
    """Rebuilds runs/<name>/view/index.html when the run's files changed since the last build."""

    def __init__(self, run_dir: Path, out: Path, sample_steps: list[int] | None, refresh_seconds: int):
        self.run_dir, self.out, self.sample_steps, self.refresh_seconds = Path(run_dir), Path(out), sample_steps, refresh_seconds
        self._last = None
        self._lock = threading.Lock()

    def current(self) -> bytes:
        with self._lock:
            sig = _signature(self.run_dir)
            if sig != self._last or not self.out.exists():
                run = read_run(self.run_dir, self.sample_steps)
                write_page(run, self.out, refresh_seconds=None if run.finished else self.refresh_seconds)
                self._last = sig
            return self.out.read_bytes()


def make_server(builder: PageBuilder, port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 (port 0: any free port; see server.server_address)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.split("?")[0] not in ("/", "/index.html"):
                self.send_error(404)
                return
            body = builder.current()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet: the terminal shows the URL, not every reload
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)
