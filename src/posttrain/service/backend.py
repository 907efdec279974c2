"""The backend of the Tinker-compatible service: base models, one LoRA adapter (peft) plus AdamW per training
client, and the samplers. Every method runs on the service's one worker thread, so the models need no locks;
user mistakes are PosttrainError (the app answers them as `category: "user"`).

Several training clients on one base share its weights: each is a named peft adapter on the one PeftModel, made
active for that client's requests. A sampler made from a training client keeps a copy of the adapter's tensors at
that moment (its snapshot) and samples those, swapped in for the call, never the newer weights (`kind=inflight`
asks for the live weights and gets them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posttrain.algorithms import tinker_losses
from posttrain.errors import PosttrainError
from posttrain.service import wire

LORA_ALPHA = 32.0  # fixed, as the SDK's LoraConfig has no alpha: the update is scaled by 32 / rank


@dataclass
class Base:
    name: str
    path: str
    model: Any  # the PeftModel over the HF model
    tokenizer: Any
    linear: list[str] = field(default_factory=list)  # the HF model's linear layers, read before any adapter
    head: str | None = None  # its output layer


@dataclass
class TrainModel:
    model_id: str
    owner: str
    session_id: str
    base: Base
    key: str  # the peft adapter name
    lora: dict  # rank, seed, train_mlp, train_attn, train_unembed
    params: list
    optimizer: Any
    steps: int = 0


@dataclass
class Sampler:
    sampler_id: str
    owner: str
    session_id: str
    base: Base
    model_path: str | None = None
    model_id: str | None = None  # the training model whose adapter it samples (None: the base model)
    snapshot: dict | None = None  # adapter tensors at creation; None with model_id: the live weights (inflight)


@dataclass
class Backend:
    base_models: dict[str, str]  # SDK base_model name -> local model directory
    dtype: str = "float32"
    max_lora_rank: int = 64
    bases: dict[str, Base] = field(default_factory=dict)
    models: dict[str, TrainModel] = field(default_factory=dict)
    samplers: dict[str, Sampler] = field(default_factory=dict)
    _next_key: int = 0

    # ---- lookup with ownership -------------------------------------------------------------------------------
    def model(self, model_id: str, owner: str) -> TrainModel:
        m = self.models.get(model_id)
        if m is None or m.owner != owner:
            raise PosttrainError(f"model_id {model_id!r} is not a live model of this API key (unknown, freed when "
                                 "its session ended, or another key's)")
        return m

    def sampler(self, sampler_id: str, owner: str) -> Sampler:
        s = self.samplers.get(sampler_id)
        if s is None or s.owner != owner:
            raise PosttrainError(f"sampling_session_id {sampler_id!r} is not a live sampler of this API key")
        return s

    def base(self, name: str) -> Base:
        if name not in self.base_models:
            raise PosttrainError(f"base_model {name!r} is not served here; allowed: {sorted(self.base_models)}",
                                 hint="add it to serve.base_models (SDK name: local model directory)")
        if name not in self.bases:
            self.bases[name] = self._load_base(name, self.base_models[name])
        return self.bases[name]

    def _load_base(self, name: str, path: str) -> Base:
        import peft

        from posttrain.models.loading import load_causal_lm

        from posttrain.models.lora import linear_layer_names, output_layer_name

        hf, tok = load_causal_lm(path, self.dtype, field=f"serve.base_models.{name}")
        linear, head = linear_layer_names(hf), output_layer_name(hf)
        # a rank-1 placeholder adapter on one layer keeps the PeftModel alive when every client's adapter is gone
        first = next(n for n, m in hf.named_modules() if n.endswith("q_proj") or n.endswith("c_attn"))
        model = peft.get_peft_model(hf, peft.LoraConfig(r=1, target_modules=[first]), adapter_name="_placeholder")
        model.eval()
        return Base(name, str(path), model, tok, linear, head)

    # ---- training models ---------------------------------------------------------------------------------------
    def _targets(self, base: Base, lora: dict) -> list[str]:
        names = []
        for n in base.linear:
            if n == base.head:
                use = lora.get("train_unembed", True)
            elif "attn" in n or "attention" in n:
                use = lora.get("train_attn", True)
            else:
                use = lora.get("train_mlp", True)
            if use:
                names.append(n)
        return names

    def add_model(self, model_id: str, owner: str, session_id: str, base_name: str, lora: dict) -> TrainModel:
        import peft
        import torch

        rank = int(lora.get("rank", 0))
        if not 1 <= rank <= self.max_lora_rank:
            raise PosttrainError(f"lora_config.rank={rank}: must be 1..{self.max_lora_rank} (serve.max_lora_rank)")
        base = self.base(base_name)
        key = f"m{self._next_key}"
        self._next_key += 1
        config = peft.LoraConfig(r=rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
                                 target_modules=self._targets(base, lora))
        with torch.random.fork_rng():
            torch.manual_seed(int(lora.get("seed") or 0))
            base.model.add_adapter(key, config)
        params = [p for n, p in base.model.named_parameters() if f".{key}." in n]
        optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        m = TrainModel(model_id, owner, session_id, base, key, dict(lora, rank=rank), params, optimizer)
        self.models[model_id] = m
        return m

    def adapter_state(self, m: TrainModel) -> dict:
        """The adapter's tensors (copies), keyed by parameter name with the adapter's key written as ADAPTER."""
        return {n.replace(f".{m.key}.", ".ADAPTER."): p.detach().clone()
                for n, p in m.base.model.named_parameters() if f".{m.key}." in n}

    def set_adapter_state(self, m: TrainModel, state: dict) -> None:
        import torch

        with torch.no_grad():
            for n, p in m.base.model.named_parameters():
                if f".{m.key}." in n:
                    p.copy_(state[n.replace(f".{m.key}.", ".ADAPTER.")])

    def free_model(self, model_id: str) -> None:
        m = self.models.pop(model_id, None)
        if m is not None:
            m.base.model.delete_adapter(m.key)
            for sid in [s for s, smp in self.samplers.items() if smp.model_id == model_id]:
                del self.samplers[sid]

    # ---- forward_backward / optim_step -------------------------------------------------------------------------
    def _check_datum(self, i: int, d: wire.DatumIn, loss_fn: str, vocab: int) -> None:
        need = ("target_tokens",) + tinker_losses.REQUIRED_INPUTS[loss_fn]
        for name in need:
            if name not in d.inputs:
                raise PosttrainError(f"forward_backward.data[{i}].loss_fn_inputs.{name}: missing; {loss_fn} needs "
                                     f"{list(need)}")
            if d.inputs[name].reshape(-1).shape[0] != len(d.tokens):
                raise PosttrainError(f"forward_backward.data[{i}].loss_fn_inputs.{name}: {d.inputs[name].size} "
                                     f"values for {len(d.tokens)} input tokens (position i scores target i)")
        for name, ids in (("model_input", d.tokens), ("loss_fn_inputs.target_tokens", d.inputs["target_tokens"])):
            bad = ids[(ids < 0) | (ids >= vocab)]
            if len(bad):
                raise PosttrainError(f"forward_backward.data[{i}].{name}: token {int(bad[0])} is outside the "
                                     f"vocabulary (0..{vocab - 1})")
        if len(d.tokens) == 0:
            raise PosttrainError(f"forward_backward.data[{i}].model_input: empty")

    def forward_backward(self, fb: wire.ForwardBackwardIn, owner: str) -> bytes:
        import torch

        if fb.loss_fn not in tinker_losses.SUPPORTED:
            raise PosttrainError(f"loss_fn={fb.loss_fn!r} is not supported by this service; supported: "
                                 f"{', '.join(tinker_losses.SUPPORTED)}")
        m = self.model(fb.model_id, owner)
        vocab = m.base.model.get_base_model().get_output_embeddings().weight.shape[0]
        for i, d in enumerate(fb.data):
            self._check_datum(i, d, fb.loss_fn, vocab)
        m.base.model.set_adapter(m.key)
        dtype = next(iter(m.params)).dtype
        outputs, total = [], 0.0
        with torch.set_grad_enabled(not fb.forward_only):
            for d in fb.data:
                targets = torch.as_tensor(d.inputs["target_tokens"].reshape(-1).astype(np.int64))
                logits = m.base.model(input_ids=torch.as_tensor(d.tokens)[None]).logits[0]
                logprobs = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
                inputs = {k: torch.as_tensor(v.reshape(-1).astype(np.float64)).to(dtype)
                          for k, v in d.inputs.items() if k != "target_tokens"}
                loss = tinker_losses.elementwise_loss(fb.loss_fn, logprobs, inputs, fb.config)
                if not fb.forward_only:
                    loss.sum().backward()
                total += float(loss.detach().sum())
                outputs.append({"logprobs": logprobs.detach().numpy(), "elementwise_loss": loss.detach().numpy()})
        return wire.encode_forward_backward_output(outputs, {"loss:sum": total})

    def optim_step(self, model_id: str, owner: str, adam) -> dict:
        import torch

        m = self.model(model_id, owner)
        for g in m.optimizer.param_groups:
            g.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                     weight_decay=adam.weight_decay)
        grads = [p.grad for p in m.params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
            if grads else 0.0
        if adam.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(m.params, adam.grad_clip_norm)
        m.optimizer.step()
        m.optimizer.zero_grad(set_to_none=True)
        m.steps += 1
        return {"metrics": {"grad_norm:mean": norm}}

    # ---- samplers ------------------------------------------------------------------------------------------------
    def add_sampler(self, sampler: Sampler) -> Sampler:
        self.samplers[sampler.sampler_id] = sampler
        return sampler

    def sampler_of_model(self, sampler_id: str, m: TrainModel, kind: str, path: str | None = None) -> Sampler:
        snapshot = None if kind == "inflight" else self.adapter_state(m)
        return self.add_sampler(Sampler(sampler_id, m.owner, m.session_id, m.base, path, m.model_id, snapshot))

    def sample(self, s: Sampler, prompt: list[int], spec, num_samples: int, want_prompt_logprobs: bool) -> bytes:
        from posttrain.service import sampling

        vocab = s.base.model.get_base_model().get_output_embeddings().weight.shape[0]
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise PosttrainError(f"SampleRequest.prompt: token {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        if not prompt:
            raise PosttrainError("SampleRequest.prompt: empty")
        decode = s.base.tokenizer.decode
        with self._weights_of(s) as model:
            seqs = sampling.sample(model, prompt, spec, num_samples, decode) if spec.max_tokens > 0 else []
            plp = sampling.prompt_logprobs(model, prompt) if want_prompt_logprobs else None
        return wire.encode_sample_response(seqs, plp)

    def _weights_of(self, s: Sampler):
        """A context manager giving the model with the sampler's weights in place, restored afterwards."""
        import contextlib

        @contextlib.contextmanager
        def swapped():
            if s.model_id is None:
                with s.base.model.disable_adapter():
                    yield s.base.model
                return
            m = self.models.get(s.model_id)
            if m is None:
                raise PosttrainError(f"sampler {s.sampler_id}: its training model {s.model_id} was freed")
            m.base.model.set_adapter(m.key)
            live = self.adapter_state(m) if s.snapshot is not None else None
            try:
                if s.snapshot is not None:
                    self.set_adapter_state(m, s.snapshot)
                yield m.base.model
            finally:
                if live is not None:
                    self.set_adapter_state(m, live)
        return swapped()
