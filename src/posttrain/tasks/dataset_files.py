"""Reading dataset files as users have them: each reader yields (locator, row) pairs, the locator naming the place
in the file an error message should point at ("line 12" for text files, "row 7" for columnar ones, 1-based).

    .parquet        pyarrow
    .csv            the stdlib csv module; a header row, every value a string; a ragged row is an error
    a directory     written by `datasets.Dataset.save_to_disk` (read with `datasets.load_from_disk`)
    anything else   JSON lines (.jsonl): one JSON object per non-blank line

Rows are plain dicts; checking what they hold is the task's job (tasks/dataset.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterator

from posttrain.errors import PosttrainError

Rows = Iterator[tuple[str, object]]


def file_format(p: Path) -> str:
    """'dataset_dir', 'parquet', 'csv' or 'jsonl' (the default, as `task.name: jsonl` always read any suffix)."""
    if p.is_dir():
        return "dataset_dir"
    return {".parquet": "parquet", ".csv": "csv"}.get(p.suffix.lower(), "jsonl")


def read_rows(path: str | Path, field: str) -> Rows:
    """(locator, row) for each row of the dataset at `path`; `field` is the config key that named it (for errors)."""
    p = Path(path)
    if not p.exists():
        raise PosttrainError(f"{field}: dataset file {p} does not exist",
                             hint="give a .jsonl, .parquet or .csv file, or a directory written by save_to_disk")
    kind = file_format(p)
    if kind == "dataset_dir":
        return dataset_dir_rows(p, field)
    return {"parquet": parquet_rows, "csv": csv_rows, "jsonl": jsonl_rows}[kind](p)


def jsonl_rows(p: Path) -> Rows:
    """("line N", parsed row) for each non-blank line; a line that is not JSON is an error naming it."""
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {lineno}", json.loads(line)
        except json.JSONDecodeError as e:
            raise PosttrainError(f"{p}, line {lineno}: not valid JSON ({e.msg})") from None


def csv_rows(p: Path) -> Rows:
    """("line N", {header: value}) per data row; N is the line the row ends on (quoted fields may span lines)."""
    with open(p, newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None:
                return
            for values in reader:
                if not values:  # a blank line
                    continue
                if len(values) != len(header):
                    which = (f"no value for column(s) {', '.join(repr(h) for h in header[len(values):])}"
                             if len(values) < len(header) else
                             f"{len(values) - len(header)} value(s) past the last column {header[-1]!r}")
                    raise PosttrainError(
                        f"{p}, line {reader.line_num}: ragged row, {len(values)} value(s) for the {len(header)} "
                        f"columns of the header: {which}",
                        hint="quote values that contain commas, and give every row one value per column",
                    )
                yield f"line {reader.line_num}", dict(zip(header, values))
        except csv.Error as e:
            raise PosttrainError(f"{p}, line {reader.line_num}: not valid CSV ({e})") from None


def parquet_rows(p: Path) -> Rows:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # noqa: BLE001 — pyarrow raises ArrowInvalid, OSError, ... for a file it cannot read
        raise PosttrainError(f"{p}: not a readable parquet file ({type(e).__name__}: {_first_line(e)})") from None
    for i, row in enumerate(table.to_pylist(), start=1):
        yield f"row {i}", row


def dataset_dir_rows(p: Path, field: str = "task.path") -> Rows:
    """Rows of a directory written by `datasets.Dataset.save_to_disk`. A DatasetDict (one subdirectory per split)
    is refused with the split directories to point at instead."""
    try:
        import datasets
    except ImportError:
        raise PosttrainError(f"{p}: reading a save_to_disk directory needs the datasets library",
                             hint="pip install 'datasets>=3'") from None
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as e:  # noqa: BLE001 — corrupt state.json, another library version, missing arrow files ...
        raise PosttrainError(
            f"{field}: {p}: datasets.load_from_disk cannot read this directory ({type(e).__name__}: {_first_line(e)})",
            hint=f"re-save it with Dataset.save_to_disk under the installed datasets {datasets.__version__}, or "
            "export it to .parquet/.jsonl (ds.to_parquet(...))",
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = ", ".join(str(p / s) for s in ds)
        raise PosttrainError(f"{field}: {p} holds a DatasetDict with splits {', '.join(ds)}; a task reads one split",
                             hint=f"point the path at one split's directory: {splits}")
    for i, row in enumerate(ds, start=1):
        yield f"row {i}", row


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0][:200] if text else "no message")
