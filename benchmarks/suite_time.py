"""The test suite's time, from the JUnit report `make test` writes (runs/test-report.xml): the whole run, each test
file's share (setup, call and teardown of its tests, module fixtures included) and the slowest tests, with the
machine it ran on and how busy its processor was (runs/test-cpu.json, written by tests/conftest.py), so the
35-minute budget of `make test` is tracked per machine and a cut is aimed at what costs.

    python benchmarks/suite_time.py [REPORT.xml] [--make-wall SECONDS]   # adds this run to results/suite_time.json
    python benchmarks/suite_time.py --table         # the docs table (docs/performance.md), from that file
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from common import machine, md_table, read_json, write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "suite_time.json"
TOP = 20


def read_report(path: Path) -> dict:
    """pytest's JUnit XML -> the run's wall seconds, counts, seconds per test file and per test (each test's time is
    its setup + call + teardown, pytest's default junit_duration_report)."""
    try:
        suite = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        sys.exit(f"error: {path}: not a readable JUnit report ({e}) -> run `make test`, which writes runs/test-report.xml")
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    tests = {}
    for case in suite.iter("testcase"):
        module = case.get("classname", "").split(".")
        path_of = "/".join(p for p in module if not p[:1].isupper()) + ".py"  # tests.evals.test_x(.Class) -> file
        tests[f"{path_of}::{case.get('name')}"] = float(case.get("time", 0))
    files = defaultdict(float)
    for name, seconds in tests.items():
        files[name.split("::")[0]] += seconds
    return {"wall_s": float(suite.get("time", 0)), "tests": int(suite.get("tests", 0)),
            "failures": int(suite.get("failures", 0)) + int(suite.get("errors", 0)),
            "files": dict(sorted(files.items(), key=lambda kv: -kv[1])),
            "slowest": dict(sorted(tests.items(), key=lambda kv: -kv[1])[:TOP])}


def read_cpu_share(path: Path) -> dict:
    """runs/test-cpu.json -> the processor's busy share over the run (busy core-seconds per wall second) and the
    number of test workers; {} when the run did not write it (runs before it existed)."""
    if not path.exists():
        return {}
    cpu = json.loads(path.read_text())
    return {"cpu_share": cpu["cpu_share"], "workers": cpu.get("workers")}


def table(results: dict) -> str:
    """One row per recorded run: its machine, its wall time (with the install where recorded), the processor's busy
    share, and its five costliest files."""
    rows = []
    for run in results["runs"]:
        top = ", ".join(f"{Path(f).name} {s:.0f}" for f, s in list(run["files"].items())[:5])
        make = f"{run['make_wall_s'] / 60:.1f}" if run.get("make_wall_s") else "-"
        share = f"{run['cpu_share'] * 100:.0f}%" if run.get("cpu_share") is not None else "-"
        rows.append([run["cpu"], run.get("commit", "?"), f"{run['wall_s'] / 60:.1f}", make, share,
                     run.get("workers") or 1, run["tests"], run["failures"], top])
    return md_table(["CPU", "commit", "pytest min", "make test min", "CPU share", "workers", "tests", "failed",
                     "costliest files (s)"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", default=str(ROOT / "runs" / "test-report.xml"))
    p.add_argument("--commit", default="?", help="the commit the report's run tested")
    p.add_argument("--make-wall", type=float, help="seconds `make test` took in all, the install included")
    p.add_argument("--table", action="store_true", help="print the docs table from the results file and exit")
    args = p.parse_args()
    results = read_json(RESULTS, default={"runs": []})
    if not args.table:
        report = Path(args.report)
        run = {"cpu": machine()["cpu"], "commit": args.commit, **read_report(report),
               **read_cpu_share(report.with_name("test-cpu.json"))}
        if args.make_wall:
            run["make_wall_s"] = args.make_wall
        results["runs"].append(run)
        write_json(RESULTS, results)
    print(table(results))


if __name__ == "__main__":
    main()
