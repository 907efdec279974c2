"""Atomic checkpoints: manifest verification, corruption detection, fallback and retention."""

import json

import pytest

from posttrain import checkpoint as ckpt


def write(root, step, payload=b"weights"):
    tmp = ckpt.begin_checkpoint(root, step)
    (tmp / "model").mkdir()
    (tmp / "model" / "model.safetensors").write_bytes(payload * 100)
    (tmp / "state.json").write_text(json.dumps({"step": step}))
    return ckpt.finalize_checkpoint(tmp, step)


def test_written_checkpoint_verifies_and_lists_every_file(tmp_path):
    path = write(tmp_path, 5)
    assert path.name == "step_000005"
    manifest = ckpt.verify_checkpoint(path)
    assert set(manifest["files"]) == {"model/model.safetensors", "state.json"}
    assert not list(tmp_path.glob(".tmp-*"))


def test_bit_flip_is_detected_and_named(tmp_path):
    path = write(tmp_path, 1)
    f = path / "model" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[10] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="model/model.safetensors.*sha256"):
        ckpt.verify_checkpoint(path)


def test_truncation_is_detected(tmp_path):
    path = write(tmp_path, 1)
    f = path / "model" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:50])
    with pytest.raises(ckpt.CheckpointError, match="truncated"):
        ckpt.verify_checkpoint(path)


def test_missing_manifest_means_incomplete(tmp_path):
    path = write(tmp_path, 1)
    (path / ckpt.MANIFEST).unlink()
    with pytest.raises(ckpt.CheckpointError, match="incomplete"):
        ckpt.verify_checkpoint(path)


def test_latest_valid_falls_back_with_message(tmp_path):
    write(tmp_path, 1)
    bad = write(tmp_path, 2)
    (bad / "state.json").write_text("{}")
    messages = []
    found = ckpt.latest_valid_checkpoint(tmp_path, warn=messages.append)
    assert found.name == "step_000001"
    assert len(messages) == 1 and "step_000002" in messages[0] and "state.json" in messages[0]


def test_unfinished_temp_dir_is_never_a_checkpoint(tmp_path):
    write(tmp_path, 1)
    tmp = ckpt.begin_checkpoint(tmp_path, 2)  # a writer killed before finalize
    (tmp / "state.json").write_text("{}")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000001"]


def test_prune_keeps_last_k_and_never_the_only_valid_one(tmp_path):
    for s in (1, 2, 3):
        write(tmp_path, s)
    removed = ckpt.prune_checkpoints(tmp_path, keep_last=2)
    assert [p.name for p in removed] == ["step_000001"]
    # corrupt both remaining but keep an older valid one: it must survive pruning to keep_last=1
    write(tmp_path, 1)
    for s in (2, 3):
        (tmp_path / ckpt.step_dir_name(s) / "state.json").write_text("corrupt")
    ckpt.prune_checkpoints(tmp_path, keep_last=1)
    assert (tmp_path / "step_000001").exists()
    assert ckpt.latest_valid_checkpoint(tmp_path, warn=lambda m: None).name == "step_000001"


def test_rewriting_a_step_replaces_it_whole(tmp_path):
    write(tmp_path, 4, b"old")
    path = write(tmp_path, 4, b"new")
    assert (path / "model" / "model.safetensors").read_bytes().startswith(b"new")
    ckpt.verify_checkpoint(path)


def test_keep_best_keeps_the_best_valid_one_and_never_the_only_valid_one(tmp_path):
    for s in (1, 2, 3, 4):
        write(tmp_path, s)
    scores = {1: 0.2, 2: 0.6, 3: 0.6, 4: 0.1}  # steps 2 and 3 tie: the newer one (3) is the best
    best = ckpt.best_checkpoint(tmp_path, scores)
    assert best.name == "step_000003"
    ckpt.prune_checkpoints(tmp_path, keep_last=1, protect=(best,))
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_000003", "step_000004"]
    # a corrupted best is not the best: the best valid one is
    (tmp_path / "step_000003" / "state.json").write_text("corrupt")
    assert ckpt.best_checkpoint(tmp_path, scores).name == "step_000004"
    assert ckpt.best_checkpoint(tmp_path, {3: 0.6}) is None
    # the newest and the best both corrupt, one older valid checkpoint: keep_last=1 keeps the newest (corrupt)
    # one by count and the only valid one by the rule; the corrupt best goes
    (tmp_path / "step_000004" / "state.json").write_text("corrupt")
    write(tmp_path, 1)
    removed = ckpt.prune_checkpoints(tmp_path, keep_last=1)
    assert [p.name for p in removed] == ["step_000003"]
    ckpt.verify_checkpoint(tmp_path / "step_000001")
    assert ckpt.latest_valid_checkpoint(tmp_path, warn=lambda m: None).name == "step_000001"
