"""The run config: one YAML file validated once with pydantic, dotted overrides from the command line, and errors
that name the key, the value and what is allowed. Every caller imports it from here:

    sections.py  the sections and RunConfig          io.py      reading, overrides, validation, the reference table
    lora.py      model.lora / rm.lora                reward.py  reward sections (and the reward SOURCES)
    rollout.py   rollout.* (engines, sampling, asynchrony, multi-turn)
    ops.py       ops.notify                          base.py    the base class of every section
    distill.py   distill (opd's teacher)
"""

from posttrain.config.io import (
    apply_overrides,
    config_reference_markdown,
    dump_config,
    load_config,
    parse_override,
    read_yaml,
    validate_config,
)
from posttrain.config.lora import FIELD as LORA_FIELD, AdapterConfig, LoraConfig
from posttrain.config.ops import EVENTS, NotifyTarget, OpsConfig
from posttrain.config.reward import JudgeConfig, RewardConfig, RewardFunctionConfig
from posttrain.config.rollout import RolloutConfig, VllmConfig
from posttrain.config.sections import (
    AlarmRule,
    AlarmsConfig,
    AlgorithmConfig,
    CheckpointConfig,
    DPOConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    RayConfig,
    RMConfig,
    RunConfig,
    SFTConfig,
    TaskConfig,
    TopologyConfig,
    TrainConfig,
)

__all__ = [
    "LORA_FIELD", "EVENTS", "AdapterConfig", "AlarmRule", "AlarmsConfig", "AlgorithmConfig", "CheckpointConfig",
    "DPOConfig", "EvalConfig", "JudgeConfig", "LoggingConfig", "LoraConfig", "ModelConfig", "NotifyTarget",
    "OpsConfig", "RMConfig", "RayConfig", "RewardConfig", "RewardFunctionConfig", "RolloutConfig", "RunConfig",
    "SFTConfig", "TaskConfig", "TopologyConfig", "TrainConfig", "VllmConfig", "apply_overrides",
    "config_reference_markdown", "dump_config", "load_config", "parse_override", "read_yaml", "validate_config",
]
