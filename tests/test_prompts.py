"""The evaluation prompts shipped in the package: unmodified (sha256), found after any install,
and read with a clear error for a malformed file."""

import hashlib
import json
from pathlib import Path

import pytest
from train_helpers import ROOT

from drafters.eval.questions import EVAL_DIR, load_questions, read_questions

SHA256 = {
    "mt_bench_question.jsonl": "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
    "spec_bench_question.jsonl": "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04",
}


@pytest.mark.parametrize("name", sorted(SHA256))
def test_the_shipped_prompt_files_are_the_published_ones(name):
    data = (EVAL_DIR / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256[name]
    assert SHA256[name] in (EVAL_DIR / "README.md").read_text()
    shared = ROOT.parent / "shared" / "eval" / name  # the team's copy, where there is one
    if shared.is_file():
        assert shared.read_bytes() == data


def test_the_prompt_sets_and_their_categories():
    mt = load_questions(EVAL_DIR / "mt_bench_question.jsonl", "mt_bench", 2, 0)
    assert len(mt) == 16 and all(len(q["turns"]) == 2 for q in mt)
    spec = load_questions(EVAL_DIR / "spec_bench_question.jsonl", "spec_bench", 3, 0)
    cats = {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert {q["category"] for q in spec} == cats and len(spec) == 18


def test_the_prompts_are_package_data():
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["drafters.eval"]
    shipped = {p.relative_to(EVAL_DIR.parent).as_posix() for p in EVAL_DIR.iterdir()}
    assert shipped == {str(Path("prompts") / n) for n in [*SHA256, "README.md"]}
    assert all(any(Path(f).match(p) for p in patterns) for f in shipped)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"question_id": 1, "category": "x", "turns": ["hi"]}\n{"question_id": 2,',
            ":2: not JSON",
        ),
        ('{"question_id": 1, "category": "x", "turns": []}', ':1: needs "turns"'),
        ('{"question_id": 1, "turns": ["hi"]}', ':1: needs "question_id" and a "category"'),
        ('{"question_id": 1, "category": "x", "turns": ["a"]}\n' * 2, ":2: question_id 1 "),
        ("\n\n", "no questions"),
    ],
)
def test_a_malformed_prompt_file_names_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "q.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        read_questions(path)
    assert str(e.value).startswith(str(path)) and message in str(e.value)


def test_questions_keep_their_fields(tmp_path):
    row = {"question_id": "a", "category": "mine", "turns": ["one", "two"], "reference": ["r"]}
    (tmp_path / "q.jsonl").write_text(json.dumps(row) + "\n")
    assert read_questions(tmp_path / "q.jsonl") == [row]
