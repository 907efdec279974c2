"""Every suite source in one place: `load_suites` resolves a suite reference (a suite file, a built-in file stem or
suite name, or `run_reward`) into `Suite`s."""

from __future__ import annotations

from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.evals.run_suite import RUN_REWARD, run_suite
from posttrain.evals.suites import BUILTIN_DIR, Suite, builtin_suite_files, read_suite_file


def load_suites(refs: list[str], run_dir: str | Path | None = None, *, allow_changed: bool = False,
                warn=print) -> list[Suite]:
    """Suites from files (all suites in each), built-in file stems (e.g. 'addition'), built-in suite names, or
    `run_reward`: the held-out split of the run in `run_dir` scored by its own reward (evals/run_suite.py)."""
    out: list[Suite] = []
    for ref in refs:
        if ref == RUN_REWARD:
            if run_dir is None:
                raise PosttrainError(f"--suite {RUN_REWARD}: this suite is built from a run's config and needs the run",
                                     hint="use `posttrain eval --from-run runs/<name>` (in eval.suites the run is "
                                     "the one being trained)")
            out.append(run_suite(run_dir, allow_changed=allow_changed, warn=warn))
            continue
        if Path(ref).is_file():
            out.extend(read_suite_file(ref))
            continue
        stem = BUILTIN_DIR / f"{ref}.yaml"
        if stem.is_file():
            out.extend(read_suite_file(stem))
            continue
        found = [s for f in builtin_suite_files() for s in read_suite_file(f) if s.name == ref]
        if not found:
            names = [f.stem for f in builtin_suite_files()]
            raise PosttrainError(f"--suite {ref}: no such file, built-in suite file or built-in suite name",
                                 hint=f"built-in suite files: {', '.join(names)}")
        out.extend(found)
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise PosttrainError(f"--suite: suite names repeat across the given suites ({names})")
    return out
