"""Config validation: unknown keys, wrong types and bad combinations name the key and what is allowed."""

import pytest

from posttrain.config import load_config, parse_override
from posttrain.errors import PosttrainError


def test_defaults_are_valid_and_overrides_apply():
    cfg = load_config(None, ["algorithm.kl_coef=0.02", "rollout.num_workers=2", "name=x"])
    assert cfg.algorithm.kl_coef == 0.02 and cfg.rollout.num_workers == 2 and cfg.name == "x"


def test_unknown_key_names_key_suggestion_and_allowed(tmp_path):
    with pytest.raises(PosttrainError) as e:
        load_config(None, ["algorithm.klcoef=0.1"])
    msg = str(e.value)
    assert "algorithm.klcoef" in msg and "did you mean 'kl_coef'" in msg and "group_size" in msg


def test_wrong_type_names_key_and_value():
    with pytest.raises(PosttrainError) as e:
        load_config(None, ["algorithm.lr=fast"])
    assert "algorithm.lr" in str(e.value) and "'fast'" in str(e.value)


def test_literal_lists_allowed_values():
    with pytest.raises(PosttrainError) as e:
        load_config(None, ["rollout.engine=sglang"])
    assert "rollout.engine" in str(e.value) and "'vllm'" in str(e.value) and "'hf'" in str(e.value)


def test_group_size_one_is_rejected_with_reason():
    with pytest.raises(PosttrainError) as e:
        load_config(None, ["algorithm.group_size=1"])
    assert "algorithm.group_size=1" in str(e.value) and "at least 2" in str(e.value)


def test_minibatches_must_divide_batch():
    with pytest.raises(PosttrainError) as e:
        load_config(None, ["algorithm.minibatches=3"])
    assert "algorithm.minibatches=3" in str(e.value)


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nalgorithm:\n  lr: [1, 2\n")
    with pytest.raises(PosttrainError) as e:
        load_config(p)
    assert str(p) in str(e.value) and "line" in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(PosttrainError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_override_syntax_errors():
    with pytest.raises(PosttrainError):
        parse_override("algorithm.lr")
    with pytest.raises(PosttrainError):
        parse_override("algorithm..lr=1")
    assert parse_override("logging.sinks=[jsonl]") == (["logging", "sinks"], ["jsonl"])


def test_override_into_a_value_is_an_error(tmp_path):
    with pytest.raises(PosttrainError, match="seed"):
        load_config(None, ["seed.x=1"])
    p = tmp_path / "run.yaml"
    p.write_text("seed: 3\n")
    with pytest.raises(PosttrainError, match="'seed' is a value, not a section"):
        load_config(p, ["seed.x=1"])


def test_yaml_file_and_overrides(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("name: from-file\nalgorithm:\n  group_size: 4\n")
    cfg = load_config(p, ["algorithm.group_size=6"])
    assert cfg.name == "from-file" and cfg.algorithm.group_size == 6


def test_engine_threads_follow_whether_generation_runs_alone():
    """rollout.engine_threads unset: the trainer's thread count when nothing runs beside generation (synchronous,
    one fixed worker), else 1; set, it wins."""
    from posttrain.rollout.worker import engine_threads, rollout_worker_env

    def threads(*overrides):
        return engine_threads(load_config(None, list(overrides)))

    trainer_threads = load_config(None, []).topology.torch_threads  # 2; 1 under the numerics matrix's threads1
    assert threads() == trainer_threads and threads("topology.torch_threads=3") == 3
    assert threads("rollout.num_workers=2") == 1
    assert threads("rollout.async_one_step_off=true") == 1
    assert threads("rollout.num_workers=1..3") == 1
    assert threads("rollout.num_workers=2", "rollout.engine_threads=4") == 4
    assert rollout_worker_env(1, 2)["OMP_NUM_THREADS"] == "2" and "OMP_NUM_THREADS" not in rollout_worker_env(1)
