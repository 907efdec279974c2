"""`posttrain probe CONFIG`: "will RL work on this task?" before a run. It samples K completions for N training
prompts with the run's own engine, prompt template and reward (the same Ray actors a run uses: a rollout worker
and the reward worker), and reports each reward source's distribution, pass@1 and pass@K, the share of prompts
whose samples differ in reward (GRPO's signal), the share cut at max_new_tokens, the mean length, an estimate of
the run's step time and trainer memory, and a verdict with next steps (probe_stats.py). Nothing is trained and
nothing is written but the report: runs/<name>/probe.json and probe.html."""

from __future__ import annotations

import html
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from posttrain.config import RunConfig
from posttrain.errors import PosttrainError
from posttrain.probe_stats import (SourceStats, Verdict, expected_signal_share, pass_at, signal_share, source_stats,
                                   trainer_peak_text, verdict)
from posttrain.training.trainer import TrainBatch

PROBE_STEP = 2**22 - 1  # the sampling seeds' step field: one no run step reaches, so the probe's draws are its own
EXAMPLES = 6


@dataclass
class ProbeReport:
    name: str
    model: str
    engine: str
    prompts: int
    k: int
    group_size: int
    success_source: str
    sources: dict[str, SourceStats]
    pass1: float
    passk: float
    signal_share: float
    expected_signal_share: float | None  # at the run's group size, for a pass/fail success source
    cut_share: float
    mean_completion_tokens: float
    generate_seconds: float
    tokens_per_s: float
    step_estimate: dict
    failure_share: float
    failures: list[str]
    verdict: Verdict
    examples: list[dict]


def success_source(cfg: RunConfig) -> str:
    """The source whose score says a sample solved its prompt: the verifier when it counts in the reward, else the
    first reward function."""
    if cfg.reward.weights.get("verifier") or not cfg.reward.functions:
        return "verifier"
    return cfg.reward.functions[0].name


def weighted_sources(cfg: RunConfig) -> set[str]:
    """The sources the run's reward adds up (a built-in source with weight 0 is computed but counts for nothing)."""
    return {n for n, w in cfg.reward.weights.items() if w} | {f.name for f in cfg.reward.functions}


def measure_train_step(cfg: RunConfig, prompts: list[list[int]], comps, rewards: list[float], k: int) -> dict:
    """Two policy updates of the configured run's size, by the run's own Trainer actor on the probe's samples (cycled
    to prompts_per_step x group_size): the second's wall time and the actor's peak resident memory over both
    (VmHWM, the embedded cluster's process on this machine). Two, because AdamW's states appear in the first
    update's optimizer step, after its activations are gone: from the second on a step holds both, as a run's do.
    The updates are thrown away with the actor."""
    import ray

    from posttrain.training.trainer import Trainer

    a = cfg.algorithm
    n = a.prompts_per_step * a.group_size
    idx = [i % len(comps) for i in range(n)]
    mean = sum(rewards) / len(rewards)
    batch = TrainBatch(prompts=[prompts[i // k] for i in idx], completions=[list(comps[i].token_ids) for i in idx],
                       advantages=[rewards[i] - mean or 0.5 for i in idx],
                       engine_logprobs=[list(comps[i].logprobs) for i in idx],
                       ref_logprobs=[list(comps[i].logprobs) for i in idx] if a.kl_coef > 0 else None)
    threads = {"env_vars": {"OMP_NUM_THREADS": str(cfg.topology.torch_threads)}}
    trainer = ray.remote(Trainer).options(num_cpus=cfg.topology.trainer_cpus, runtime_env=threads).remote(
        cfg.to_dict(), cfg.model.path)
    try:
        pid = ray.get(trainer.process.remote())["pid"]
        first = time.perf_counter()
        ray.get(trainer.train_step.remote(batch))
        started = time.perf_counter()
        ray.get(trainer.train_step.remote(batch))
        seconds = time.perf_counter() - started
        peak_kb = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("VmHWM:"))
    finally:
        ray.kill(trainer)
    tokens = sum(len(p) + len(c) for p, c in zip(batch.prompts, batch.completions)) / n
    return {"samples": n, "train_s": round(seconds, 2), "first_train_s": round(started - first, 2),
            "trainer_peak_gb": round(peak_kb * 1024 / 1e9, 2), "tokens_per_sample": round(tokens, 1)}


def step_estimate(cfg: RunConfig, gen_seconds_per_sample: float, train: dict | None) -> dict:
    """One step of the configured run: generation scaled from the probe's measured time per sample, and the
    measured policy update (measure_train_step) with the trainer's peak memory; the planner's memory model of the
    trainer beside it (topology/memory.py::cpu_trainer_peak_bytes at the run's micro-batch and these samples'
    mean length)."""
    from posttrain.topology.memory import train_state_bytes
    from posttrain.topology.model_shape import read_model_shape

    a = cfg.algorithm
    shape = read_model_shape(cfg.model.path)
    out = {"samples": a.prompts_per_step * a.group_size, "params": shape.params,
           "generate_s": round(gen_seconds_per_sample * a.prompts_per_step * a.group_size, 2),
           "weights_grads_adam_gb": round(train_state_bytes(shape, "float32") / 1e9, 2)}
    if train:
        predicted = predicted_trainer_peak(cfg, shape, train["tokens_per_sample"])
        out["trainer_peak_predicted_gb"] = round(predicted / 1e9, 2)
    return {**out, **(train or {})}


def predicted_trainer_peak(cfg: RunConfig, shape, tokens_per_sample: float) -> float:
    """The planner's trainer peak (bytes) for this run: one micro-batch (train.micro_batch rows, else the whole
    minibatch) of samples of the mean length, packed (train.packing) or padded alike."""
    from posttrain.topology.memory import BYTES_PER_ELEMENT, cpu_trainer_peak_bytes
    from posttrain.training import batch

    a, t = cfg.algorithm, cfg.train
    n = a.prompts_per_step * a.group_size
    rows = n // a.minibatches if n >= a.minibatches else n
    tokens = round(tokens_per_sample * min(rows, t.micro_batch or rows))
    dtype = cfg.model.dtype if cfg.model.dtype in BYTES_PER_ELEMENT else "float32"  # auto: as the checkpoint, mostly
    return sum(cpu_trainer_peak_bytes(shape, tokens, dtype, t.activation_checkpointing,
                                      batch.HEAD_CHUNK_TOKENS).values())


def _prepare(cfg: RunConfig):
    """The run's own task, model checks, reward functions and prompt encoder, as `posttrain train` checks them."""
    from posttrain.models.loading import PromptEncoder, check_model_dir, check_vocab, load_tokenizer
    from posttrain.rewards.functions import check_functions
    from posttrain.tasks import load_task
    from posttrain.tasks.base import answer_needed

    if cfg.rollout.multi_turn or cfg.rollout.agent is not None:
        raise PosttrainError("probe: multi-turn and agent runs (rollout.environment / rollout.tools / rollout.agent) "
                             "are not probed yet",
                             hint="probe the single-turn form of the task, or start a short run with --quiet")
    task = load_task(cfg.task, cfg.seed, need_answer=answer_needed(cfg.reward.weights))
    check_model_dir(cfg.model.path)
    check_functions(cfg.reward.functions, getattr(task, "columns", ()))
    tokenizer = load_tokenizer(cfg.model.path)
    check_vocab(cfg.model.path, tokenizer)
    return task, PromptEncoder(tokenizer, cfg.model.chat_template)


def _actors(cfg: RunConfig):
    """A rollout worker and the reward worker (and the reward model, the judge) as a run creates them."""
    import ray

    from posttrain.orchestration.roles import Roles
    from posttrain.rewards.worker import RewardWorker
    from posttrain.rollout.worker import RolloutWorker, rollout_worker_env

    t, v = cfg.topology, cfg.rollout.vllm
    engine_kwargs = dict(dtype=cfg.model.dtype, seed=cfg.seed, max_model_len=v.max_model_len,
                         kv_cache_gb=v.kv_cache_gb, gpu_memory_utilization=v.gpu_memory_utilization,
                         enforce_eager=v.enforce_eager)
    worker = ray.remote(RolloutWorker).options(
        num_cpus=t.rollout_cpus, num_gpus=t.rollout_gpus,
        runtime_env={"env_vars": rollout_worker_env(v.kv_cache_gb, t.torch_threads)}).remote(
        cfg.rollout.engine, cfg.model.path, engine_kwargs)
    reward = ray.remote(RewardWorker).options(num_cpus=t.reward_cpus).remote(cfg.to_dict())
    reward_model = judge = None
    if cfg.reward.weights.get("rm"):
        from posttrain.rewards.reward_model import RewardModel

        reward_model = ray.remote(RewardModel).options(num_cpus=cfg.reward.rm_cpus).remote(
            [cfg.reward.rm_path, *cfg.reward.rm_ensemble], 1, cfg.model.chat_template)
    if cfg.reward.weights.get("judge"):
        from posttrain.rewards.judge import make_judge

        judge = make_judge(cfg, cfg.run_dir)
    try:
        ray.get([worker.pid.remote(), reward.score.remote([])]
                + ([reward_model.score.remote([])] if reward_model is not None else []))
    except ray.exceptions.RayActorError as e:
        from posttrain.orchestration.roles import raise_user_error_of

        raise_user_error_of(e)
    return Roles(trainer=None, rollout=[worker], reward=reward, reference=None, placement_group=None,
                 reward_model=reward_model, judge=judge)


def _sample_and_score(cfg: RunConfig, roles, encoder, problems, k: int):
    from posttrain.rewards.scoring import score_batch
    from posttrain.rollout.engine import SamplingSpec
    from posttrain.rollout.fleet import generate_on_workers
    from posttrain.rollout.sampler import sample_seed

    r = cfg.rollout
    prompts = [encoder.encode(p.prompt) for p in problems]
    seeds = [sample_seed(cfg.seed, PROBE_STEP, i) for i in range(len(problems))]
    # one short request first: an engine's first call compiles and warms up, which no step of a run pays again
    generate_on_workers(roles.rollout, prompts[:1], SamplingSpec(1, 2, r.temperature, r.top_p), seeds[:1])
    started = time.perf_counter()
    groups = generate_on_workers(roles.rollout, prompts, SamplingSpec(k, r.max_new_tokens, r.temperature, r.top_p),
                                 seeds)
    seconds = time.perf_counter() - started
    comps = [c for g in groups for c in g]
    items = [(p.id, p.prompt, p.answer, encoder.decode_completion(c.token_ids)) for p, g in zip(problems, groups)
             for c in g]
    scored = score_batch(cfg, roles, items, [len(c.token_ids) for c in comps], roles.judge,
                         completion_ids=[list(c.token_ids) for c in comps],
                         sample_ids=[f"probe/{p.id}/{j}" for p in problems for j in range(k)], step="probe",
                         columns=[p.columns for p in problems for _ in range(k)])
    return prompts, comps, items, scored, seconds


def run_probe(cfg: RunConfig, n_prompts: int = 16, k: int = 8, log=print, train_step: bool = True) -> ProbeReport:
    """Samples, scores and judges (module docstring); the report is also written to runs/<name>/probe.{json,html}."""
    from posttrain.orchestration.runtime import start_ray, stop_ray

    import ray

    if n_prompts < 1 or k < 2:
        raise PosttrainError(f"probe: --prompts {n_prompts} --k {k}", hint="use at least 1 prompt and K >= 2 samples")
    task, encoder = _prepare(cfg)
    problems = task.train[:n_prompts]
    started_ray = not ray.is_initialized()
    start_ray(cfg.ray, cfg.topology.rollout_cpus + cfg.topology.reward_cpus + cfg.topology.trainer_cpus + 1)
    try:
        log(f"probe: {len(problems)} prompts x {k} samples on the {cfg.rollout.engine} engine ({cfg.model.path})")
        roles = _actors(cfg)
        prompts, comps, items, scored, seconds = _sample_and_score(cfg, roles, encoder, problems, k)
        ray.kill(roles.rollout[0])  # its memory back before the trainer loads
        train = measure_train_step(cfg, prompts, comps, scored.rewards, k) if train_step else None
    finally:
        if started_ray:
            stop_ray()
    report = build_report(cfg, problems, prompts, comps, items, scored, seconds, k, train)
    write_report(cfg.run_dir, report)
    return report


def build_report(cfg: RunConfig, problems, prompts, comps, items, scored, seconds: float, k: int,
                 train: dict | None) -> ProbeReport:
    source = success_source(cfg)
    success_scores = scored.components.get(source) or scored.verifier
    successes = [s is not None and s >= 1.0 for s in success_scores]
    pass1, passk = pass_at(successes, k)
    binary = all(s is None or s in (0.0, 1.0) for s in success_scores)
    lengths = [len(c.token_ids) for c in comps]
    cut = sum(c.finish_reason == "length" for c in comps) / len(comps)
    failures = list(dict.fromkeys(e for e in scored.errors if e is not None))
    failure_share = scored.failures / len(comps)
    signal = signal_share(scored.rewards, k)
    examples = [{"prompt": str(it[1])[-300:], "completion": it[3][:300], "reward": round(r, 4)}
                for it, r in list(zip(items, scored.rewards))[:: max(1, len(items) // EXAMPLES)][:EXAMPLES]]
    return ProbeReport(
        name=cfg.name, model=str(cfg.model.path), engine=cfg.rollout.engine, prompts=len(problems), k=k,
        group_size=cfg.algorithm.group_size, success_source=source,
        sources={n: s for n, v in scored.components.items() if n in weighted_sources(cfg)
                 and (s := source_stats(v)) is not None},
        pass1=pass1, passk=passk, signal_share=signal,
        expected_signal_share=(expected_signal_share(successes, k, cfg.algorithm.group_size)
                               if binary and weighted_sources(cfg) == {source} else None),
        cut_share=cut, mean_completion_tokens=sum(lengths) / len(lengths), generate_seconds=seconds,
        tokens_per_s=sum(lengths) / max(seconds, 1e-9),
        step_estimate=step_estimate(cfg, seconds / len(comps), train),
        failure_share=failure_share, failures=failures[:5],
        verdict=verdict(signal, pass1, cut, failure_share, k), examples=examples)


def report_text(r: ProbeReport) -> str:
    lines = [f"probe of {r.name}: {r.prompts} training prompts x K={r.k} samples, {r.engine} engine, model {r.model}",
             "", "reward sources (over all samples):",
             *(f"  {n:<16} mean {s.mean:.3f}  std {s.std:.3f}  min {s.minimum:.3f}  max {s.maximum:.3f}  "
               f"non-zero {100 * s.nonzero:.0f}%" + (f"  ({s.scored} scored)" if s.scored != r.prompts * r.k else "")
               for n, s in r.sources.items()),
             "", f"pass@1 {100 * r.pass1:.1f}%   pass@{r.k} {100 * r.passk:.1f}%   (success: {r.success_source} >= 1)",
             f"prompts with a learning signal (their {r.k} rewards differ): {100 * r.signal_share:.0f}%"]
    if r.expected_signal_share is not None:
        lines.append(f"expected at the run's group_size={r.group_size}: {100 * r.expected_signal_share:.0f}% of groups")
    e = r.step_estimate
    train = (f"the policy update {e['train_s']:.1f} s (measured: the run's trainer on these samples), "
             + trainer_peak_text(e['trainer_peak_gb'], e.get('trainer_peak_predicted_gb'))
             if "train_s" in e else "the update not measured")
    lines += [f"completions: mean {r.mean_completion_tokens:.1f} tokens, {100 * r.cut_share:.0f}% cut at "
              f"max_new_tokens; {r.tokens_per_s:.0f} tokens/s generated",
              f"one step of the run ({e['samples']} samples): generation ~{e['generate_s']:.1f} s (scaled from "
              f"here), {train}; weights + gradients + AdamW {e['weights_grads_adam_gb']:.2f} GB "
              f"({e['params']:,} parameters)"]
    if r.failures:
        lines += [f"reward failures: {100 * r.failure_share:.0f}% of the samples, e.g.:",
                  *(f"  {f}" for f in r.failures)]
    lines += ["", f"verdict: {r.verdict.name}: {r.verdict.summary}", *(f"  - {s}" for s in r.verdict.next_steps)]
    return "\n".join(lines)


def write_report(run_dir: Path, r: ProbeReport) -> Path:
    """runs/<name>/probe.json and probe.html (the text report, the sample completions as a table)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "probe.json").write_text(json.dumps(asdict(r), indent=1))
    rows = "".join(f"<tr><td><pre>{html.escape(x['prompt'])}</pre></td><td><pre>{html.escape(x['completion'])}"
                   f"</pre></td><td>{x['reward']}</td></tr>" for x in r.examples)
    page = (f"<!doctype html><meta charset=utf-8><title>probe: {html.escape(r.name)}</title>"
            "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}pre{white-space:pre-wrap;margin:0}"
            "td{vertical-align:top;border-top:1px solid #ccc;padding:.3em}.v{font-size:1.3em;font-weight:bold}</style>"
            f"<h1>Will RL work on {html.escape(r.name)}?</h1><p class=v>{html.escape(r.verdict.name)}: "
            f"{html.escape(r.verdict.summary)}</p><ul>"
            + "".join(f"<li>{html.escape(s)}</li>" for s in r.verdict.next_steps)
            + f"</ul><pre>{html.escape(report_text(r))}</pre><h2>Samples</h2><table><tr><th>prompt</th>"
              f"<th>completion</th><th>reward</th></tr>{rows}</table>")
    (run_dir / "probe.html").write_text(page)
    return run_dir / "probe.html"
