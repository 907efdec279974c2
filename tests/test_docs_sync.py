"""The README routes and the docs follow the code: generated blocks current, links resolve, every docs page reachable
from the README, the README at most 250 lines, no number tied to a moment of the project's history."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [m for m in LINK.findall(text) if not re.match(r"[a-z]+:", m)]


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_generated_blocks_are_current():
    """docs/config.md (every config key), docs/architecture.md (layers, modules), docs/performance.md (perf.json)
    and the README's layout must match the code and the tree."""
    # In a process of its own: under the numerics matrix's threads1 setting, conftest.py changes the default of
    # topology.torch_threads in this one, and docs/config.md lists the declared defaults.
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_readme.py"), "--check"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, "regenerate with `make readme`:\n" + check.stdout + check.stderr[-2000:]


def test_readme_is_at_most_250_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines; move detail to docs/ and link it"


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for link in _links(page):
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, "broken links:\n  " + "\n  ".join(broken)


def test_every_docs_page_and_the_changelog_are_reachable_from_the_readme():
    readme = ROOT / "README.md"
    seen, todo = {readme}, [readme]
    while todo:
        page = todo.pop()
        for link in _links(page):
            target = (page.parent / link.partition("#")[0]).resolve()
            if target.suffix == ".md" and target.exists() and target not in seen:
                seen.add(target)
                todo.append(target)
    missing = [p.relative_to(ROOT).as_posix() for p in PAGES if p.resolve() not in seen]
    assert not missing, f"not reachable by links from README.md: {missing}"


MOMENT = re.compile(r"this session|earlier session|before the seed fix|with the seed fix|from the issue report|"
                    r"New on \d|measured \d{4}-\d\d-\d\d|(GPU|machine)[^.]*this task|earlier machine", re.I)


def test_no_number_is_tied_to_a_moment_of_the_projects_history():
    """Numbers name their machine, not when they were taken (CHANGELOG.md is where history goes)."""
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for p in PAGES if p.name != "CHANGELOG.md"
             for i, line in enumerate(p.read_text().splitlines(), 1) if MOMENT.search(line)]
    assert not found, "moment-bound wording:\n  " + "\n  ".join(found)


def test_numerics_table_writes_its_block_into_a_docs_page(tmp_path):
    spec = importlib.util.spec_from_file_location("numerics_table", ROOT / "scripts" / "numerics_table.py")
    numerics_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(numerics_table)
    (tmp_path / "native").mkdir()
    (tmp_path / "native" / "pytest.log").write_text("grpo: reward steps 1-5 -> 16-20 gain +0.450, z 22.9\n"
                                                    "===== 8 passed in 3.2s =====\n")
    doc = tmp_path / "page.md"
    doc.write_text("before\n<!-- numerics:start -->\nstale table\n<!-- numerics:end -->\nafter\n")
    numerics_table.write(numerics_table.table(str(tmp_path)), doc)
    text = doc.read_text()
    assert "| grpo | +0.450 (z 22.9) |" in text and "| pytest | 8 passed |" in text and "stale table" not in text
    assert text.startswith("before\n") and text.endswith("after\n")
    assert "<!-- numerics:start -->" in (ROOT / "docs" / "algorithms.md").read_text()
