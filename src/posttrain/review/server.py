"""Serves the review app with uvicorn: one process, bound to exactly the host given. Any host but loopback needs a
token, since the page shows model outputs and stores judgments for whoever can reach it.

    python -m posttrain.review.server --db review.db --port 8780             # this machine only
    POSTTRAIN_REVIEW_TOKEN=... python -m posttrain.review.server --db review.db --host <this machine's LAN address>
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from posttrain.errors import PosttrainError

TOKEN_ENV = "POSTTRAIN_REVIEW_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # other 127.x addresses count as exposed: they need the token too


def check_exposure(host: str, token: str | None) -> None:
    if host not in LOOPBACK and not token:
        raise PosttrainError(
            f"--host {host} serves the review page beyond this machine, and no token is set",
            hint=f"pass --token T (or set {TOKEN_ENV}=T); reviewers open the link with ?token=T once")


def run_server(db: str | Path, *, host: str = "127.0.0.1", port: int = 8780, token: str | None = None,
               runs_root: str | Path = "runs") -> None:
    """Serves the review app over `db` until interrupted (Ctrl-C)."""
    import uvicorn

    from posttrain.review.app import make_app

    check_exposure(host, token)
    app = make_app(db, token=token, runs_root=runs_root)
    shown = f"[{host}]" if ":" in host else host
    print(f"review page: http://{shown}:{port}/{'?token=<your token>' if token else ''}  (db {db}, runs {runs_root})",
          flush=True)
    uvicorn.run(app, host=host, port=port, workers=1, log_level="warning", access_log=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.review.server", description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the review database (SQLite); created when missing")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8780)
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"required off loopback (or ${TOKEN_ENV})")
    parser.add_argument("--runs-root", default="runs", help="the directory whose runs the sample browser may read")
    args = parser.parse_args(argv)
    try:
        run_server(args.db, host=args.host, port=args.port, token=args.token, runs_root=args.runs_root)
    except PosttrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
