"""Python-hook scorers the suite tests name as evalhooks:FUNCTION."""


def length_score(prompt: str, output: str, record: dict) -> float:
    """A stand-in reward model: longer is better."""
    return float(len(output))


def contains_answer(prompt: str, output: str, record: dict) -> float:
    return 1.0 if record["answer"] in output else 0.0
