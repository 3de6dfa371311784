"""Every reference the code and docs make inside the repository resolves: `docs/design.md
section N` names a section that exists, and a repository path a docstring, comment, config or
README names is there."""

import re
import subprocess

import pytest
from train_helpers import ROOT

PATH = re.compile(
    r"(?<![\w./-])((?:drafters|benchmarks|conf|slurm|docs|data|tests)/[\w/.-]*\w\.(?:py|md|yaml|sh|sbatch|jsonl))\b"
)
# a path inside the package, named from its subpackage down (`models/falcon.py`)
PACKAGE_PATH = re.compile(
    r"(?<![\w./-])((?:models|losses|decoding|training|export|eval|cli|engines)/[\w/.-]*\w\.py)\b"
)
# files of other repositories, cited with their repository: Bestpay-inc/Falcon, hemingkx/Spec-Bench
EXTERNAL = {"models/choices.py", "data/spec_bench/question.jsonl"}
SECTION = re.compile(r"docs/design\.md sections? (\d+)(?:\s*-\s*(\d+))?")


def tracked(*suffixes: str) -> list:
    cmd = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    names = [n for n in out.stdout.splitlines() if n.endswith(suffixes) or n == "Makefile"]
    return [ROOT / n for n in names if not n.startswith("tests/fixtures") and (ROOT / n).is_file()]


SOURCES = tracked(".py", ".yaml", ".md", ".sh", ".sbatch", "run")


def test_design_sections_cited_exist():
    headings = re.findall(r"^## (\d+)\.", (ROOT / "docs/design.md").read_text(), flags=re.M)
    cited = set()
    for path in SOURCES:
        for m in SECTION.finditer(path.read_text(errors="replace")):
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            cited |= {(n, path.name) for n in range(lo, hi + 1)}
    assert cited, "nothing cites docs/design.md"
    missing = sorted((n, f) for n, f in cited if str(n) not in headings)
    assert not missing


def test_repository_paths_named_exist():
    missing = []
    for path in SOURCES:
        for m in PATH.finditer(path.read_text(errors="replace")):
            ref = m.group(1)
            if ref not in EXTERNAL and not (ROOT / ref).exists():
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
        for m in PACKAGE_PATH.finditer(path.read_text(errors="replace")):
            ref = m.group(1)
            homes = (ROOT / "drafters", ROOT / "drafters" / "data")
            if ref not in EXTERNAL and not any((home / ref).exists() for home in homes):
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not missing, "\n".join(missing)
