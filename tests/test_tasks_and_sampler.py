"""Built-in tasks (disjoint splits, verifiers), the jsonl dataset's row errors, and the data cursor."""

import pytest

from posttrain.config import TaskConfig
from posttrain.errors import PosttrainError
from posttrain.rollout.fleet import split_evenly
from posttrain.rewards.verifier import score_one
from posttrain.rollout.sampler import MAX_GROUP_SIZE, Cursor, PromptSampler, prompt_seeds, sample_seed
from posttrain.tasks import Problem, load_task


@pytest.mark.parametrize("name", ["addition", "sorting"])
def test_splits_are_disjoint_seeded_and_verifiable(name):
    task = load_task(TaskConfig(name=name, train_size=3000, heldout_size=300), seed=0)
    assert len(task.train) == 3000 and len(task.heldout) == 300
    assert not {p.prompt for p in task.train} & {p.prompt for p in task.heldout}
    again = load_task(TaskConfig(name=name, train_size=3000, heldout_size=300), seed=0)
    assert [p.id for p in again.heldout] == [p.id for p in task.heldout]
    other = load_task(TaskConfig(name=name, train_size=3000, heldout_size=300), seed=1)
    assert [p.id for p in other.heldout] != [p.id for p in task.heldout]
    p = task.heldout[0]
    assert task.score(p, p.answer) == 1.0 and task.score(p, p.answer + "1") == 0.0


def test_addition_answers_are_sums():
    task = load_task(TaskConfig(name="addition", train_size=100, heldout_size=10), seed=0)
    for p in task.train[:20]:
        a, b = p.prompt.rstrip("=").split("+")
        assert int(p.answer) == int(a) + int(b)


def test_jsonl_rows_with_errors_name_the_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    with pytest.raises(PosttrainError, match=r"line 2.*answer"):
        load_task(TaskConfig(name="jsonl", path=str(f), heldout_size=1), seed=0)
    f.write_text('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    with pytest.raises(PosttrainError, match="line 2: not valid JSON"):
        load_task(TaskConfig(name="jsonl", path=str(f), heldout_size=1), seed=0)
    f.write_text("")
    with pytest.raises(PosttrainError, match="empty"):
        load_task(TaskConfig(name="jsonl", path=str(f), heldout_size=1), seed=0)


def test_verifier_failures_become_records_not_crashes():
    class Broken:
        def score(self, problem, completion):
            if completion == "raise":
                raise ZeroDivisionError("boom")
            return {"nan": float("nan"), "str": "1"}.get(completion, 0.5)

    p = Problem("x", "q", "a")
    assert score_one(Broken(), p, "raise").error.startswith("exception: ZeroDivisionError")
    assert score_one(Broken(), p, "nan").error is not None
    assert score_one(Broken(), p, "str", default=-1.0).reward == -1.0
    assert score_one(Broken(), p, "ok").reward == 0.5


def test_sampler_cursor_resumes_exactly_and_crosses_epochs():
    problems = [Problem(str(i), str(i), str(i)) for i in range(10)]
    s = PromptSampler(problems, seed=3)
    first = [p.id for p in s.next_batch(4)]
    cursor = Cursor(**s.state())
    rest = [p.id for p in s.next_batch(8)]  # crosses into epoch 1
    resumed = PromptSampler(problems, seed=3, cursor=cursor)
    assert [p.id for p in resumed.next_batch(8)] == rest
    assert s.cursor.epoch == 1 and s.cursor.offset == 2
    assert sorted(first + rest[:6]) == sorted(p.id for p in problems)  # an epoch sees each prompt once


def test_split_evenly_and_seeds():
    assert split_evenly(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split_evenly(2, 3) == [(0, 1), (1, 2), (2, 2)]
    assert sample_seed(0, 1, 2) != sample_seed(0, 2, 1)


def effective_seeds(run_seed: int, step: int, prompt_indices, group_size: int) -> list[int]:
    """The seed each sample is drawn with: its prompt's seed + the sample index (vLLM's rule, HfEngine's too)."""
    return [sample_seed(run_seed, step, i) + j for i in prompt_indices for j in range(group_size)]


def test_every_sample_of_a_run_has_a_seed_of_its_own():
    # by hand: run 1, step 2, prompt 3 -> ((1 * 2**22 + 2) * 2**16 + 3) * 2**10
    assert sample_seed(1, 2, 3) == ((1 * 4194304 + 2) * 65536 + 3) * 1024 == 2**48 + 2 * 2**26 + 3 * 2**10 == 281475110931456
    # The old layout (run * 1_000_003 + step * 10_007 + prompt) gave 8 prompts x 4 samples 11 streams, not 32:
    old = {(0 + 1 * 10_007 + i) + j for i in range(8) for j in range(4)}
    assert len(old) == 11
    assert len(set(effective_seeds(0, 1, range(8), 4))) == 32
    # A run: 60 steps of 32 prompts x 8 samples, each step with up to two refill rounds (prompt index 32..95,
    # as DAPO numbers them), a resume re-deriving the same seeds, and a largest group at the layout's edge.
    run = [s for step in range(60) for s in effective_seeds(0, step, range(96), 8)]
    assert len(run) == len(set(run)) == 60 * 96 * 8
    assert effective_seeds(0, 17, range(96), 8) == run[17 * 768 : 18 * 768]  # resume: same step, same seeds
    edge = effective_seeds(0, 5, [0, 1], MAX_GROUP_SIZE)
    assert len(set(edge)) == 2 * MAX_GROUP_SIZE
    assert not set(run) & set(effective_seeds(1, 0, range(96), 8))  # another run seed, other streams
    # eval suites: prompt i's block of samples never meets prompt i+1's
    blocks = [b + j for b in prompt_seeds(7, 50) for j in range(MAX_GROUP_SIZE)]
    assert len(blocks) == len(set(blocks))
    with pytest.raises(ValueError, match="prompt index"):
        sample_seed(0, 0, 1 << 16)
    with pytest.raises(ValueError, match="step"):
        sample_seed(0, -1, 0)


def test_last_number_match_by_hand():
    from posttrain.tasks.base import last_number_match

    assert last_number_match("12", "The answer is 12.") == 1.0
    assert last_number_match("12", "12") == 1.0 and last_number_match("-3", "It is -3") == 1.0
    assert last_number_match("12", "12 is wrong, it is 13") == 0.0   # the last number counts, not the first
    assert last_number_match("12", "12.5") == 0.0                    # a decimal is one number
    assert last_number_match("12", "no number") == 0.0 and last_number_match("12", "") == 0.0
    assert last_number_match("200", "1,200") == 1.0                  # no separators: said in its docstring
    task = load_task(TaskConfig(name="addition", train_size=10, heldout_size=5, reward="last_number"), seed=0)
    p = task.heldout[0]
    assert task.score(p, f"So the sum is {p.answer}.") == 1.0


def test_digit_credit_by_hand():
    from posttrain.tasks.base import digit_credit

    assert digit_credit("724", "724") == 1.0
    assert digit_credit("724", "725") == pytest.approx(2 / 3)   # hundreds and tens right
    assert digit_credit("724", "24") == pytest.approx(2 / 3)    # units and tens right, hundreds missing
    assert digit_credit("724", "7240") == 0.0                   # every digit shifted
    assert digit_credit("1000", "999") == 0.0
    assert digit_credit("724", "7a4") == 0.0 and digit_credit("724", "") == 0.0
    task = load_task(TaskConfig(name="addition", train_size=10, heldout_size=5, reward="digits"), seed=0)
    p = task.heldout[0]
    assert task.score(p, p.answer) == 1.0
