"""The trainer's checkpoint state format: `trainer_state.pt` (optimizer, torch and Python RNG, update count) and, from
the sharded trainer (topology.trainer_ranks > 1), `trainer_shards/` (torch.distributed.checkpoint: policy and
optimizer, one file per rank). Written and read by training/trainer.py and training/distributed.py; a single-rank
trainer resumes from a sharded checkpoint with `load_sharded_optimizer`."""

from __future__ import annotations

from pathlib import Path

TRAINER_STATE = "trainer_state.pt"
SHARDS_DIR = "trainer_shards"


def jsonable(state):
    """random.getstate() with its tuples as lists, as saved in trainer_state.pt."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def tuplify(state):
    """The inverse of `jsonable`: the tuples random.setstate takes."""
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)


def fqn_optimizer_state(model, index_state: dict) -> dict:
    """A single-rank optimizer state dict (keyed by parameter index, in model.parameters() order) keyed by
    parameter name instead, the form torch.distributed.checkpoint.state_dict reads and writes."""
    names = [name for name, _ in model.named_parameters()]
    groups = [dict(g, params=[names[i] for i in g["params"]]) for g in index_state["param_groups"]]
    return {"state": {names[i]: s for i, s in index_state["state"].items()}, "param_groups": groups}


def load_sharded_optimizer(model, optimizer, ckpt_dir: str | Path) -> None:
    """Loads the optimizer states of a sharded checkpoint into a single-rank (unsharded) model's optimizer: the
    N -> 1 direction. Runs without a process group (torch.distributed.checkpoint reads every shard)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_optimizer_state_dict

    _, optim_sd = get_state_dict(model, optimizer)
    state = {"optim": optim_sd}
    dcp.load(state, checkpoint_id=str(Path(ckpt_dir) / SHARDS_DIR), no_dist=True)
    set_optimizer_state_dict(model, optimizer, state["optim"])
