"""The test suite's time, from the JUnit report `make test` writes (runs/test-report.xml): the whole run, each test
file's share (setup, call and teardown of its tests, module fixtures included) and the slowest tests, with the
machine it ran on, so the 45-minute budget of `make test` is tracked per machine and a cut is aimed at what costs.

    python benchmarks/suite_time.py [REPORT.xml]    # adds this run to benchmarks/results/suite_time.json
    python benchmarks/suite_time.py --table         # the docs table (docs/performance.md), from that file
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from common import machine, md_table, read_json, write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "suite_time.json"
TOP = 15


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


def table(results: dict) -> str:
    """One row per recorded run: its machine, its wall time, and its five costliest files."""
    rows = []
    for run in results["runs"]:
        top = ", ".join(f"{Path(f).name} {s:.0f}" for f, s in list(run["files"].items())[:5])
        rows.append([run["cpu"], run.get("commit", "?"), f"{run['wall_s'] / 60:.1f}", run["tests"], run["failures"], top])
    return md_table(["CPU", "commit", "pytest min", "tests", "failed", "costliest files (s)"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", default=str(ROOT / "runs" / "test-report.xml"))
    p.add_argument("--commit", default="?", help="the commit the report's run tested")
    p.add_argument("--table", action="store_true", help="print the docs table from the results file and exit")
    args = p.parse_args()
    results = read_json(RESULTS, default={"runs": []})
    if not args.table:
        run = {"cpu": machine()["cpu"], "commit": args.commit, **read_report(Path(args.report))}
        results["runs"].append(run)
        write_json(RESULTS, results)
    print(table(results))


if __name__ == "__main__":
    main()
