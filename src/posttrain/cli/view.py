"""`posttrain view`: the run page, written beside the run or served while it goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from posttrain.errors import PosttrainError


def parse_steps(text: Optional[str]) -> list[int] | None:
    if not text:
        return None
    try:
        steps = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise PosttrainError(f"--steps {text!r}: expected step numbers separated by commas", hint="e.g. --steps 1,50,100") from None
    return steps or None


def view(
    run_dir: str = typer.Argument(..., help="The run's directory, e.g. runs/demo."),
    out: Optional[str] = typer.Option(None, "--out", help="HTML file to write (default: RUN_DIR/view/index.html)."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Steps whose sample completions to show, e.g. 1,50,100 (default: first, middle, last)."),
    serve: bool = typer.Option(False, "--serve", help="Serve the page on 127.0.0.1 and rebuild it while the run goes on."),
    port: int = typer.Option(8765, "--port", help="Port for --serve (0: any free port)."),
    refresh: int = typer.Option(5, "--refresh", min=1, help="Seconds between reloads of a served page of a run in progress."),
):
    """A self-contained HTML page of a run: curves, step-time split, busy roles, alarms, checkpoints, samples."""
    from posttrain.view import read_run, write_page
    from posttrain.view.serve import PageBuilder, make_server

    run_path = Path(run_dir)
    target = Path(out) if out else run_path / "view" / "index.html"
    sample_steps = parse_steps(steps)
    if not serve:
        run = read_run(run_path, sample_steps)
        for note in run.notes:
            typer.echo(f"note: {note}", err=True)
        typer.echo(f"wrote {write_page(run, target)}")
        return
    builder = PageBuilder(run_path, target, sample_steps, refresh)
    builder.current()  # fail here, with the run's error, rather than on the first request
    try:
        server = make_server(builder, port)
    except OSError as e:
        raise PosttrainError(f"--port {port}: cannot listen on 127.0.0.1 ({e.strerror})", hint="pick another --port (0: any free one)") from None
    host, bound = server.server_address[:2]
    typer.echo(f"serving {target} at http://{host}:{bound}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
