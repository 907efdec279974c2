"""Do two tokenizers give the same ids? On-policy distillation (algorithm.name=opd) has the teacher score the
student's token ids as they are, so the teacher's tokenizer must map every text to the student's ids: the same
vocabulary (token -> id), the same special tokens, and the same ids on a fixed set of probe strings (which catches a
different normaliser or pre-tokeniser over the same vocabulary). Checked once at the run's start (loop.py)."""

from __future__ import annotations

from pathlib import Path

from posttrain.errors import PosttrainError
from posttrain.models.loading import check_model_dir, check_vocab, load_tokenizer

# Digits and arithmetic (the built-in tasks), prose, punctuation, whitespace runs, non-ASCII, and chat markup.
PROBES = (
    "0123456789", "12+34=46", "sort: 3,1,2", "the quick brown fox jumps over the lazy dog.",
    "Hello, World! It's 3.14 - isn't it?", "  two  spaces\tand\nnew lines\n\n", "naïve café – 東京 🙂",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
)
SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def first_tokenizer_difference(student, teacher) -> str | None:
    """None when `teacher` gives `student`'s ids; else the first difference found, in words (a token, an id)."""
    if len(student) != len(teacher):
        return f"the student has {len(student)} tokens, the teacher {len(teacher)}"
    for name in SPECIAL_IDS:
        s, t = getattr(student, name, None), getattr(teacher, name, None)
        if s != t:
            return f"{name} is {s} in the student, {t} in the teacher"
    teacher_vocab = teacher.get_vocab()
    for token, i in sorted(student.get_vocab().items(), key=lambda kv: kv[1]):
        if teacher_vocab.get(token) != i:
            return f"token {token!r} is id {i} in the student, {teacher_vocab.get(token)} in the teacher"
    for text in PROBES:
        s, t = student.encode(text, add_special_tokens=False), teacher.encode(text, add_special_tokens=False)
        if s != t:
            k = next((j for j, (a, b) in enumerate(zip(s, t)) if a != b), min(len(s), len(t)))
            return (f"{text!r} encodes differently from token {k} on: student {s[k:k + 4]}, teacher {t[k:k + 4]}")
    return None


def check_teacher(student_dir: str | Path, student_tok, teacher_dir: str | Path, *,
                  field: str = "distill.teacher") -> None:
    """The teacher's directory loads like a model directory and its tokenizer gives the student's ids; else a
    PosttrainError that names `field`, both directories and the first difference."""
    check_model_dir(teacher_dir, field=field)
    teacher_tok = load_tokenizer(teacher_dir)
    check_vocab(teacher_dir, teacher_tok, field=field)
    diff = first_tokenizer_difference(student_tok, teacher_tok)
    if diff is not None:
        raise PosttrainError(
            f"{field}: the tokenizer in {teacher_dir} differs from the student's (model.path {student_dir}): {diff}",
            hint="the teacher scores the student's token ids as they are: pick a teacher of the same tokenizer "
            "family (the same tokenizer files), or distil into a student with the teacher's tokenizer",
        )
