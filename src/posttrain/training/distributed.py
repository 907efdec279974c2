"""The sharded trainer: one rank of a data-parallel group of Ray actors that form a torch.distributed process group
(gloo on CPU; NCCL would be the backend for a policy on CUDA, which this trainer does not place today) and shard
the policy with PyTorch's FSDP2 `fully_shard` (parameters, gradients and AdamW states split across ranks; each
decoder layer and the root are one FSDP unit). FSDP2 runs on gloo/CPU with torch 2.13 (forward, backward with
reduce-scatter, clip_grad_norm_ over DTensors, full-state gather, distributed checkpoint), so DDP is not needed.

Every rank receives the whole step batch and takes its contiguous share of each minibatch; each rank's loss is its
share of the global batch's loss (same token or sequence denominators as one rank would use), so the summed
gradient is the one-rank gradient. All ranks keep the same torch RNG, so minibatch order matches one rank's.

Checkpoints: `model/` (whole HF weights, written by rank 0), `trainer_shards/` (torch.distributed.checkpoint: the
policy and optimizer as shards, reloadable with any number of ranks, or by the single-rank Trainer) and
`trainer_state.pt` (RNG, update count, the rank count; no optimizer: that is in the shards).

With model.lora nothing is sharded: every rank holds the whole frozen base model and the adapters (the adapters'
gradients and AdamW states are small; sharding the frozen base would cost an all-gather of it on every forward to
save its memory on each rank). After each backward the adapters' gradients are all-reduced (one flat tensor: what
DDP would do), so every rank takes the same update and the adapters stay identical. Checkpoints, weight export and
the reference (adapters off) are the single Trainer's, from rank 0 alone."""

from __future__ import annotations

import os
import random
import socket
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from posttrain.training.accumulation import micro_batches
from posttrain.training.trainer import Trainer
from posttrain.training.trainer_state import SHARDS_DIR, TRAINER_STATE, fqn_optimizer_state, jsonable, tuplify

COLLECTIVE_TIMEOUT = timedelta(minutes=10)  # a rank that died leaves the others waiting this long at most


# ------------------------------------------------------------------------------------------ pure pieces


def rank_rows(idx: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous share of a minibatch's sample indices (shares differ in size by at most one)."""
    return torch.tensor_split(idx, world_size)[rank]


def rank_micro_batches(local: torch.Tensor, most_rows: int, size: int | None) -> list[torch.Tensor]:
    """A rank's rows of a minibatch in micro-batches of `size` (accumulation.micro_batches), padded with empty ones
    to the count of the rank with the most rows (`most_rows`), so that every rank runs as many forwards and
    backwards."""
    parts = micro_batches(local, size)
    count = 1 if size is None else max(1, -(-most_rows // size))
    return parts + [local[:0]] * (count - len(parts))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ one rank


class ShardedTrainer(Trainer):
    """Rank `rank` of `world_size`. Built in two calls so the group can rendezvous: the constructor only records
    its arguments, `rendezvous_address` (rank 0) picks the master address and port, `join` (every rank at once)
    forms the process group, loads and shards the policy. Then it answers the single Trainer's calls."""

    def __init__(self, cfg_dict: dict, model_dir: str, rank: int, world_size: int):
        self._init_args = (cfg_dict, model_dir)
        self.rank, self.world_size = rank, world_size

    def rendezvous_address(self) -> tuple[str, int]:
        """127.0.0.1 when the whole group is on one node; this node's address when it spans several."""
        import ray

        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        host = "127.0.0.1" if len(nodes) == 1 else ray.util.get_node_ip_address()
        return host, free_port()

    def join(self, host: str, port: int) -> dict:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        super().__init__(*self._init_args)
        backend = "nccl" if next(self.model.parameters()).is_cuda else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size, timeout=COLLECTIVE_TIMEOUT)
        joined = {"rank": self.rank, "backend": backend, "pid": os.getpid(), "host": host, "port": port}
        if self.lora is not None:  # replicated (see the module docstring); the Trainer's optimizer holds the adapters
            self.trained = [p for p in self.model.parameters() if p.requires_grad]
            for p in self.trained:  # the same seed gave every rank the same A; rank 0's makes sure of it
                dist.broadcast(p.data, 0)
            return joined
        mesh = init_device_mesh("cuda" if backend == "nccl" else "cpu", (self.world_size,))
        for layer in _decoder_layers(self.model):
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        # fully_shard swapped the parameters for DTensors: the optimizer must hold the new ones.
        a = self.cfg.algorithm
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=a.lr, betas=tuple(a.betas),
                                           weight_decay=a.weight_decay)
        return joined

    def __repr__(self) -> str:  # Ray's state API lists actors by this (repr_name)
        return f"ShardedTrainer(rank={self.rank})"

    def where(self) -> dict:
        import ray

        return {"rank": self.rank, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    # ------------------------------------------------------------------ training

    # The policy update is Trainer.train_step; these hooks make it this rank's share of it.

    # Two passes always: the pre-update logprobs come from a no-grad pass whose rows the ranks sum (a single pass
    # would fill only this rank's rows during the gradient pass).
    single_pass_update = False

    def _local_micro_batches(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """This rank's contiguous share of `idx` in micro-batches (train.micro_batch), as many on every rank
        (FSDP's collectives); an empty one runs on row 0 with a loss weight of 0."""
        W = self.world_size
        return rank_micro_batches(rank_rows(idx, self.rank, W), -(-len(idx) // W), self.cfg.train.micro_batch)

    def _gradient_scale(self) -> int:
        # FSDP averages gradients over ranks (with LoRA, average_gradients does); times W makes it the sum of the
        # ranks' shares, the one-rank gradient.
        return self.world_size

    def _sum_over_ranks(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    def _reduce_gradients(self) -> None:
        if self.lora is not None:  # replicated adapters: FSDP is not there to average their gradients
            average_gradients(self.trained, self.world_size)

    def _extra_metrics(self) -> dict:
        return {"trainer_ranks": self.world_size}

    # ------------------------------------------------------------------ weights and checkpoints

    def reference_logprobs(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]] | None:
        """The base model's logprobs (adapters off; LoRA only, as in Trainer). Not a collective: every rank holds the
        whole model, so rank 0 answers and the others return None at once."""
        return super().reference_logprobs(prompts, completions) if self.rank == 0 else None

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole policy on rank 0 (CPU tensors, HF names; a tied output head once, under the embedding's
        name); {} on the other ranks. A collective: every rank calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if full and getattr(self.model.config, "tie_word_embeddings", False):
            full.pop("lm_head.weight", None)
        return {k: v.contiguous() for k, v in full.items()}

    def export_weights(self) -> bytes | None:
        """safetensors bytes of the whole policy from rank 0 (None from the others). With LoRA, Trainer's payload."""
        from safetensors.torch import save

        if self.lora is not None:
            return super().export_weights() if self.rank == 0 else None
        full = self.full_state()
        return save(full) if self.rank == 0 else None

    def export_arrays(self) -> dict | None:
        """The whole policy as an array payload (models/weights.py) from rank 0 (None from the others). With LoRA,
        Trainer's payload (what changed)."""
        from posttrain.models.weights import arrays_from_tensors

        if self.lora is not None:
            return super().export_arrays() if self.rank == 0 else None
        full = self.full_state()
        return arrays_from_tensors(full) if self.rank == 0 else None

    def save(self, ckpt_tmp_dir: str) -> None:
        import torch.distributed.checkpoint as dcp
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import get_state_dict

        d = Path(ckpt_tmp_dir)
        if self.lora is not None:  # Trainer's checkpoint (adapter, merged model/, optimizer): the ranks hold the same
            if self.rank == 0:
                super().save(ckpt_tmp_dir)
            dist.barrier()
            return
        full = self.full_state()
        if self.rank == 0:
            (d / "model").mkdir(parents=True, exist_ok=True)
            save_file(full, str(d / "model" / "model.safetensors"), metadata={"format": "pt"})
            self.model.config.save_pretrained(str(d / "model"))
            if getattr(self.model, "generation_config", None) is not None:
                self.model.generation_config.save_pretrained(str(d / "model"))
            self.tokenizer.save_pretrained(str(d / "model"))
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(d / SHARDS_DIR))
        if self.rank == 0:
            torch.save({"torch_rng": torch.get_rng_state(), "updates": self.updates, "trainer_ranks": self.world_size,
                        "python_rng": list(jsonable(random.getstate()))}, d / TRAINER_STATE)
        dist.barrier()

    def load(self, ckpt_dir: str) -> None:
        """From a checkpoint written by any number of ranks (its shards), or by the single-rank Trainer (its whole
        weights and optimizer state, split here)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

        d = Path(ckpt_dir)
        if self.lora is not None:  # every rank reads Trainer's checkpoint whole (a LoRA checkpoint has no shards)
            super().load(ckpt_dir)
            return
        ts = torch.load(d / TRAINER_STATE, weights_only=True)
        if (d / SHARDS_DIR).is_dir():
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=str(d / SHARDS_DIR))
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        else:
            from safetensors.torch import load_file

            full: dict[str, torch.Tensor] = {}
            for f in sorted((d / "model").glob("*.safetensors")):
                full.update(load_file(str(f)))
            if getattr(self.model.config, "tie_word_embeddings", False):
                full.setdefault("lm_head.weight", full["model.embed_tokens.weight"])
            set_state_dict(self.model, self.optimizer, model_state_dict=full,
                           optim_state_dict=fqn_optimizer_state(self.model, ts["optimizer"]),
                           options=StateDictOptions(full_state_dict=True))
        torch.set_rng_state(ts["torch_rng"])
        random.setstate(tuplify(ts["python_rng"]))
        self.updates = int(ts["updates"])

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def average_gradients(params: list[torch.Tensor], world_size: int) -> None:
    """Replaces each parameter's gradient by its mean over the ranks, in one all-reduce of the gradients flattened
    into one tensor (a parameter without a gradient counts as zeros). A collective: every rank calls it."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    for p, g in zip(params, torch.split(flat, [g.numel() for g in grads])):
        p.grad = g.view_as(p).clone()


def _decoder_layers(model) -> list:
    for path in ("model.layers", "transformer.h", "gpt_neox.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            return list(obj)
    return []  # unknown architecture: the root alone is one FSDP unit
