"""The tiny models the rollout tests share, built once per session (no hub)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

# Output-embedding scale that turns a random tiny model (near-uniform next-token distribution, top-1 margins
# often < 0.01 nats) into a peaked one (top-1 p ~0.25-0.4, median margin ~0.4 nats): greedy decoding then
# cannot flip on float rounding, and its logprobs differ from the unscaled model's by whole nats.
PEAKED_SCALE = 8.0


@dataclass
class TinyModels:
    """HF model directories. `*_a`: random init, seed 0. `*_b`: seed 1 with the output embedding scaled by
    PEAKED_SCALE (for tied models that is the shared embedding, so the input side changes too)."""

    untied_a: Path
    untied_b: Path
    tied_a: Path
    tied_b: Path


def _build_peaked(out_dir: Path, *, tied: bool, seed: int) -> Path:
    import torch

    from posttrain.models.loading import load_causal_lm
    from posttrain.models.tiny import build_tiny_model

    build_tiny_model(out_dir, "1m", tie_word_embeddings=tied, seed=seed)
    model, tokenizer = load_causal_lm(out_dir)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(PEAKED_SCALE)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    from posttrain.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("rollout_models")
    return TinyModels(
        untied_a=build_tiny_model(root / "untied_a", "1m", seed=0),
        untied_b=_build_peaked(root / "untied_b", tied=False, seed=1),
        tied_a=build_tiny_model(root / "tied_a", "1m", tie_word_embeddings=True, seed=0),
        tied_b=_build_peaked(root / "tied_b", tied=True, seed=1),
    )
