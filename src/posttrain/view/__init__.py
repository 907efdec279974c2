"""`posttrain view runs/<name>`: a self-contained HTML page of a run (finished or in progress), optionally served
on 127.0.0.1 and rebuilt while the run goes on. data.py reads the run, svg.py draws, page.py lays out, serve.py serves."""

from posttrain.view.data import read_run
from posttrain.view.page import build_page, write_page

__all__ = ["build_page", "read_run", "write_page"]
