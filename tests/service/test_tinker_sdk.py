"""The real `tinker` 0.38.0 SDK against `posttrain serve` (a subprocess on 127.0.0.1, float64 weights) on the real
SmolLM2-135M-Instruct: losses against hand computations, optim_step, sampling, compute_logprobs, save/resume with
the optimizer, two clients isolated, a retried request done once, refusals with their messages.

Comparisons: the server computes in float64; per-token logprobs travel as float32 (the SDK's wire), so a float64
value v and its wire copy w satisfy |v - w| <= 2^-24 |v| (round to nearest); totals (metrics) travel as float64.
"""

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
KEY, OTHER_KEY = "tml-posttrain-test", "tml-someone-else"
EPS32 = 2.0 ** -24  # float32's unit roundoff
BASE = "smollm2"
SESSION_TIMEOUT_S = 20  # the SDK beats every 10 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    model_dir, _ = smollm2_dir
    work = tmp_path_factory.mktemp("serve")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    log = work / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "serve", f"serve.base_models.{BASE}={model_dir}", f"serve.port={port}",
         "serve.dtype=float64", f"serve.state_dir={work / 'state'}", f"serve.session_timeout_s={SESSION_TIMEOUT_S}"],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=work)
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, f"posttrain serve exited:\n{log.read_text()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert time.time() < deadline, f"posttrain serve did not listen within 120 s:\n{log.read_text()}"
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}", model_dir
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def service(server):
    for k, v in {"TINKER_TELEMETRY": "0", "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_OFFLINE": "1"}.items():
        os.environ[k] = v
    import tinker

    return tinker.ServiceClient(base_url=server[0], api_key=KEY)


@pytest.fixture(scope="module")
def reference(server):
    """The base model in float64 in this process, and a short text's tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(server[1], dtype=torch.float64).eval()
    ids = AutoTokenizer.from_pretrained(server[1]).encode("The capital of France is Paris.")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0]
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()
    return ids, lp


def _datum(ids, **inputs):
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(ids[1:], dtype=np.int64),
                                       **{k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}})


def _close32(wire, exact):
    wire, exact = np.asarray(wire, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    assert np.all(np.abs(wire - exact) <= EPS32 * np.abs(exact) + 1e-300), (wire, exact)


def _adam(lr=1e-3):
    from tinker import types

    return types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)


def _step(tc, ids, weights):
    tc.forward_backward([_datum(ids, weights=weights)], "cross_entropy").result()
    tc.optim_step(_adam()).result()


def _loss(tc, ids, weights) -> float:
    return tc.forward([_datum(ids, weights=weights)], "cross_entropy").result().metrics["loss:sum"]


def test_cross_entropy_and_importance_sampling_equal_the_hand_computation(service, reference):
    ids, lp = reference  # a fresh LoRA adapter has B = 0: the model is the base model
    tc = service.create_lora_training_client(base_model=BASE, rank=4).result()
    w = np.linspace(-1.0, 2.0, len(lp)).astype(np.float32)  # negative weights too
    out = tc.forward([_datum(ids, weights=w)], "cross_entropy").result()
    assert out.metrics["loss:sum"] == pytest.approx(float(np.sum(-lp * w.astype(np.float64))), rel=1e-12)
    _close32(out.loss_fn_outputs[0]["logprobs"].data, lp)
    _close32(out.loss_fn_outputs[0]["elementwise_loss"].data, -lp * w.astype(np.float64))
    old = (lp - 0.1).astype(np.float32)
    adv = np.linspace(1.0, -1.0, len(lp)).astype(np.float32)
    out = tc.forward([_datum(ids, logprobs=old, advantages=adv)], "importance_sampling").result()
    want = np.sum(-np.exp(lp - old.astype(np.float64)) * adv.astype(np.float64))
    assert out.metrics["loss:sum"] == pytest.approx(float(want), rel=1e-12)
    ratio, a64 = np.exp(lp - old.astype(np.float64)), adv.astype(np.float64)  # ratios e^0.1 = 1.105
    config = {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}  # so that the clip binds
    out = tc.forward([_datum(ids, logprobs=old, advantages=adv)], "ppo", loss_fn_config=config).result()
    want = np.sum(-np.minimum(ratio * a64, np.clip(ratio, 0.95, 1.05) * a64))
    assert out.metrics["loss:sum"] == pytest.approx(float(want), rel=1e-12)
    out = tc.forward([_datum(ids, logprobs=old, advantages=adv)], "cispo", loss_fn_config=config).result()
    assert out.metrics["loss:sum"] == pytest.approx(float(np.sum(-np.clip(ratio, 0.95, 1.05) * lp * a64)), rel=1e-12)


def test_optim_step_then_save_and_resume_with_the_optimizer_matches_the_uninterrupted_run(service, reference):
    ids, lp = reference
    w = np.ones(len(lp), dtype=np.float32)
    tc = service.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()

    def step(client) -> float:  # the loss before the step (forward_backward reports it), then the step
        loss = client.forward_backward([_datum(ids, weights=w)], "cross_entropy").result().metrics["loss:sum"]
        client.optim_step(_adam()).result()
        return loss

    before = step(tc)
    path = tc.save_state("resume-test").result().path
    after = step(tc)
    assert after < before - 1e-3, (before, after)
    uninterrupted = _loss(tc, ids, w)
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert step(resumed) == pytest.approx(after, rel=1e-12)
    # Adam's moments from the checkpoint make this step equal the uninterrupted one
    assert _loss(resumed, ids, w) == pytest.approx(uninterrupted, rel=1e-12)


def test_sampling_logprobs_and_compute_logprobs_equal_the_trainers_and_snapshots_stay(service, reference):
    from tinker import types

    ids, lp = reference
    tc = service.create_lora_training_client(base_model=BASE, rank=4).result()
    _step(tc, ids, np.ones(len(lp), dtype=np.float32))
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = ids[:5]
    params = types.SamplingParams(max_tokens=3, seed=7, temperature=1.0, stop=[])
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2, sampling_params=params).result()
    assert len(res.sequences) == 2 and all(len(s.tokens) == 3 for s in res.sequences)
    assert len({s.sequence_id for s in res.sequences}) == 2
    seq = res.sequences[0]
    full = prompt + list(seq.tokens)
    trainer = tc.forward([_datum(full, weights=np.ones(len(full) - 1))], "cross_entropy").result()
    trainer_lp = np.asarray(trainer.loss_fn_outputs[0]["logprobs"].data, dtype=np.float64)
    sampled = np.asarray(seq.logprobs, dtype=np.float64)
    # both float64 on the server (KV-cache decode vs one forward: ~1e-13 apart), each rounded to float32
    assert np.all(np.abs(sampled - trainer_lp[-3:]) <= EPS32 * (np.abs(sampled) + np.abs(trainer_lp[-3:])) + 1e-12)
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
    assert scored[0] is None
    assert np.all(np.abs(np.asarray(scored[1:]) - trainer_lp) <= EPS32 * 2 * np.abs(trainer_lp) + 1e-12)
    _step(tc, ids, np.ones(len(lp), dtype=np.float32))  # newer weights: the old sampler keeps its snapshot
    again = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2, sampling_params=params).result()
    assert [list(s.tokens) for s in again.sequences] == [list(s.tokens) for s in res.sequences]
    assert [list(s.logprobs) for s in again.sequences] == [list(s.logprobs) for s in res.sequences]
    newer = tc.save_weights_and_get_sampling_client().result()
    fresh = newer.compute_logprobs(types.ModelInput.from_ints(full)).result()
    assert fresh[1:] != scored[1:]


def test_two_clients_on_one_base_are_isolated(service, reference):
    ids, lp = reference
    w = np.ones(len(lp), dtype=np.float32)
    a = service.create_lora_training_client(base_model=BASE, rank=4).result()
    b = service.create_lora_training_client(base_model=BASE, rank=8).result()
    base_loss = _loss(b, ids, w)
    a.forward_backward([_datum(ids, weights=w)], "cross_entropy")  # interleaved: a's step submitted, then b's read
    b_during = b.forward([_datum(ids, weights=w)], "cross_entropy")
    a.optim_step(_adam()).result()
    assert b_during.result().metrics["loss:sum"] == pytest.approx(base_loss, rel=1e-12)
    assert _loss(a, ids, w) < base_loss - 1e-3
    assert _loss(b, ids, w) == pytest.approx(base_loss, rel=1e-12)


def test_a_retried_submit_runs_once(service, server):
    tc = service.create_lora_training_client(base_model=BASE, rank=2).result()
    body = {"model_id": tc.model_id, "seq_id": 1000, "type": "optim_step",
            "adam_params": {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}}
    headers = {"X-API-Key": KEY}
    ran = httpx.get(f"{server[0]}/api/v1/healthz").json()["executed"].get("optim_step", 0)
    rids = []
    for _ in range(2):  # the second submit comes after the first ran: a retry whose answer was lost
        rids.append(httpx.post(f"{server[0]}/api/v1/optim_step", json=body, headers=headers).json()["request_id"])
        done = httpx.post(f"{server[0]}/api/v1/retrieve_future", json={"request_id": rids[-1]},
                          headers=headers, timeout=60).json()
        assert "metrics" in done, done
    assert rids[0] == rids[1]
    assert httpx.get(f"{server[0]}/api/v1/healthz").json()["executed"]["optim_step"] == ran + 1


def test_refusals_name_the_problem(service, server, reference):
    import tinker

    ids, lp = reference
    with pytest.raises(Exception, match=r"base_model 'no-such-model' is not served here; allowed: \['smollm2'\]"):
        service.create_lora_training_client(base_model="no-such-model", rank=4).result()
    tc = service.create_lora_training_client(base_model=BASE, rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match=r"loss_fn='dro' is not supported.*supported: cross_entropy, "
                                                        r"importance_sampling, ppo, cispo"):
        tc.forward_backward([_datum(ids, weights=np.ones(len(lp)))], "dro").result()
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\]\.model_input: token 999999 is outside"):
        tc.forward([_datum([999999] + ids[1:], weights=np.ones(len(lp)))], "cross_entropy").result()
    other = httpx.post(f"{server[0]}/api/v1/get_info", json={"model_id": tc.model_id},
                       headers={"X-API-Key": OTHER_KEY})
    assert other.status_code == 400 and "not a live model of this API key" in other.json()["error"]
    with pytest.raises(tinker.RequestFailedError, match="no such checkpoint of this API key"):
        service.create_training_client_from_state(f"tinker://{tc.model_id}/weights/never-saved").result()
    bad = httpx.post(f"{server[0]}/api/v1/create_model", json={"session_id": 5}, headers={"X-API-Key": KEY})
    assert bad.status_code == 400 and "CreateModelRequest." in bad.json()["error"]


def test_a_finished_or_expired_session_frees_its_models(server):
    import tinker

    url, headers = server[0], {"X-API-Key": KEY}

    def live(model_id):
        return httpx.post(f"{url}/api/v1/get_info", json={"model_id": model_id}, headers=headers).status_code == 200

    with tinker.ServiceClient(base_url=url, api_key=KEY) as sc:  # its exit calls sessions/{id}/finish
        model_id = sc.create_lora_training_client(base_model=BASE, rank=2).result().model_id
        assert live(model_id)
    assert not live(model_id)
    # a client killed mid-run: a session that stops beating
    start = time.time()
    sid = httpx.post(f"{url}/api/v1/create_session", json={"tags": [], "user_metadata": None, "sdk_version": "x"},
                     headers=headers).json()["session_id"]
    rid = httpx.post(f"{url}/api/v1/create_model", json={"session_id": sid, "model_seq_id": 0, "base_model": BASE,
                                                         "lora_config": {"rank": 2}}, headers=headers).json()
    done = httpx.post(f"{url}/api/v1/retrieve_future", json={"request_id": rid["request_id"]}, headers=headers,
                      timeout=60).json()
    assert live(done["model_id"])
    while live(done["model_id"]):
        assert time.time() - start < SESSION_TIMEOUT_S + 30, "the silent session's model was not freed"
        time.sleep(0.2)
    assert time.time() - start >= SESSION_TIMEOUT_S  # not before its timeout


def test_base_model_sampling_greedy_top_k_and_stop_tokens(service, reference):
    from tinker import types

    ids, _ = reference
    sampler = service.create_sampling_client(base_model=BASE).result()
    prompt = types.ModelInput.from_ints(ids[:5])

    def tokens(**params):
        seq = sampler.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(**params)).result().sequences[0]
        return list(seq.tokens), seq.stop_reason

    greedy, reason = tokens(max_tokens=3, temperature=0.0, stop=[])
    assert reason == "length" and len(greedy) == 3
    assert tokens(max_tokens=3, temperature=1.0, top_k=1, seed=5, stop=[]) == (greedy, "length")
    assert tokens(max_tokens=3, temperature=0.0, stop=[greedy[1]]) == (greedy[:2], "stop")


def test_serve_refuses_a_port_in_use_and_an_open_host_without_keys(server):
    url, model_dir = server
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    port = url.rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "posttrain.cli", "serve", f"serve.base_models.{BASE}={model_dir}"]
    busy = subprocess.run(cmd + [f"serve.port={port}"], env=env, capture_output=True, text=True, timeout=120)
    assert busy.returncode == 2 and f"serve.port={port}: cannot listen on 127.0.0.1:{port}" in busy.stderr, busy.stderr
    assert "Traceback" not in busy.stderr
    open_host = subprocess.run(cmd + ["serve.host=0.0.0.0", f"serve.port={_free_port()}"], env=env,
                               capture_output=True, text=True, timeout=120)
    assert open_host.returncode == 2 and "serve.host=0.0.0.0: serves beyond this machine and serve.api_keys is empty" \
        in open_host.stderr, open_host.stderr
