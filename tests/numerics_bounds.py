"""The bound for tests that check two computation paths agree (1 rank vs 2, packed vs padded rows, the head at the
completion positions vs the full forward, base + adapter vs merged LoRA, a resumed trainer vs an uninterrupted one):
both paths run in float64, and their results may differ by F64_TOL relative to the result's size.

Why not float32 with a tolerance measured on one machine. Two paths that compute the same function in exact
arithmetic differ only by rounding, and which order a sum takes is the kernel's choice: MKL's AVX-512 path blocks a
matmul differently from its AVX2 path, gloo adds the ranks' shares in its own order, a packed row is a [rows,
columns] matmul of another shape than the padded one. A sum of n terms in any order is within
(n - 1) * u * sum|x_i| of the exact sum (u = the unit roundoff, 2**-24 = 6.0e-8 in float32; Higham, Accuracy and
Stability of Numerical Algorithms, 2nd ed., eq. 4.4), so a tolerance measured on one CPU is one sample of that error,
not a bound: on an AVX512-FP16/AMX Xeon the 2-rank KL moved by 6.7e-5 (relative) against a measured 5e-7. AdamW makes
it worse: it divides each gradient by its own RMS, so rounding noise on a gradient that is 0 in exact arithmetic
(k_proj's bias: softmax ignores a shift shared by all keys) moves that weight by up to lr per update.

The float64 budget. u = 2**-53 = 1.1e-16. The models in these tests have reductions of at most n = 512 terms
(the tiny 1m model's MLP; hidden 128, vocabulary <= 80, sequences <= 22 tokens, batches <= 8 rows), chained through
fewer than 100 operations (4 layers x ~20), on values whose sum|x| / |sum x| stays below ~10 (a random-init model:
logits and logprobs of order 1-10). Per result that is at most 100 * 512 * 10 * 1.1e-16 = 5.7e-11 relative. Adam's
magnification is harmless in float64: a gradient rounding error dg moves a weight by at most lr * dg / adam_eps
(adam_eps = 1e-8), i.e. 3e-3 * 1e-15 / 1e-8 = 3e-10 in the worst case of a gradient that is exactly 0 and of size
1e-15 of noise, and by lr * (dg / g) ~ 1e-16 relative otherwise; a few steps compound that by a small factor.
F64_TOL = 1e-8 leaves > 10x over the worst case of each, and is still 1e-4 of float32's rounding alone.

Where float64 is not quite float64. transformers' RMSNorm (Llama, Qwen2 and the tiny models) normalises in
float32 and eager attention takes its softmax in float32, whatever the model's dtype. The norm is harmless here:
both paths round float64 values that agree to ~1e-16 to float32, which gives the same float32 unless a rounding
boundary lies between them (a chance of ~1e-16 / 1.2e-7 = 1e-9 per element), and its sum runs along the hidden size
in the same order for every row. The eager softmax is not: its float32 sum runs in an order that depends on where a
sequence sits in its row, and packed rows differed from padded ones by 5e-8 under ATEN_CPU_CAPABILITY=default, so
tests/test_packing.py keeps that softmax in float64.

A real defect is far outside it: a missing average across ranks, a wrong mask or a position off by one changes the
loss, a logprob or a weight by 1e-3 .. 1 (each converted test's planted defect is reported in docs/numerics.md)."""

from __future__ import annotations

import torch

F64_TOL = 1e-8
EPS32 = 2.0 ** -24  # float32's unit roundoff
# The config overrides of a run compared in float64: vLLM has no float64 kernels, so the hf engine generates.
FLOAT64 = ("model.dtype=float64", "rollout.engine=hf")


def lora_merge_bounds(peft_model) -> dict:
    """{"<layer>.weight": elementwise bound} on how far two float32 merges of a LoRA layer, W + s * B @ A, done in
    any order (peft's merge_and_unload: B A, scaled, added; ours: one addmm) can be apart. Each is a sum of r + 1
    terms (r products b_ik a_kj, then w_ij), within (r + 1) * EPS32 * (|W| + s |B| @ |A|) of the exact value (as in
    the module docstring; Higham eq. 3.5), so two of them are within twice that. For float32 checks only: take it before
    merging (it reads the base weights and the adapters)."""
    from posttrain.models.lora import adapted_layers

    out = {}
    with torch.no_grad():
        for name, layer in adapted_layers(peft_model).items():
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            w, s = layer.get_base_layer().weight, layer.scaling["default"]
            out[f"{name}.weight"] = 2 * (a.shape[0] + 1) * EPS32 * (w.abs() + s * (b.abs() @ a.abs()))
    return out


def gap(a, b) -> float:
    """max |a - b| / max(1, max |a|) over floats, tensors, (nested) lists of them or dicts of tensors with the same
    keys: the relative gap for results of size > 1, the absolute one below (logprobs near 0, a KL of 1e-3)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), (sorted(a), sorted(b))
    x, y = _flat(a), _flat(b)
    assert x.shape == y.shape, (x.shape, y.shape)
    if x.numel() == 0:
        return 0.0
    return float((x - y).abs().max()) / max(1.0, float(x.abs().max()))


def state_gap(a: dict, b: dict) -> float:
    """The worst per-tensor gap between two state dicts with the same keys (checkpoint weights or adapters): max over
    tensors of max |a - b| / max(1, max |b|), so a small tensor is judged against its own size, not the largest's."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max()) / max(1.0, float(b[k].abs().max())) for k in a)


def assert_same(a, b, what: str = "") -> None:
    """Asserts gap(a, b) <= F64_TOL, with the gap in the message. Both sides must have been computed in float64."""
    for side in (a, b):
        for t in side.values() if isinstance(side, dict) else [side]:
            if isinstance(t, torch.Tensor):
                assert t.dtype == torch.float64, f"{what}: {t.dtype}; the bound holds for float64 results only"
    g = gap(a, b)
    assert g <= F64_TOL, f"{what}: gap {g:.3g} > bound {F64_TOL:g}"


def _flat(v) -> torch.Tensor:
    if isinstance(v, dict):
        return torch.cat([_flat(v[k]) for k in sorted(v)]) if v else torch.zeros(0, dtype=torch.float64)
    if isinstance(v, torch.Tensor):
        return v.detach().reshape(-1).to(torch.float64)
    if isinstance(v, (list, tuple)):
        parts = [_flat(x) for x in v]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    return torch.tensor([float(v)], dtype=torch.float64)


def f64(data, **kwargs) -> torch.Tensor:
    """torch.tensor(data) in float64, for hand-worked numbers checked at abs 1e-6: a float32 sum of n terms may be
    n * EPS32 * sum|x| off (1e-6 for 4 terms of size 4), float64's 1e-15 on the same is exact enough on any CPU."""
    return torch.tensor(data, dtype=torch.float64, **kwargs)
