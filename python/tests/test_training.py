# The training functions against PyTorch's own results (tests/fixtures/c_api/training.json,
# written by make_training_fixtures.py): on the NumPy fallback without a GPU, and through the
# kernels (NumPy arrays staged on the device) with one.
import json
import os

import numpy as np
import pytest

from stepgraph import kernels as k

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "fixtures", "c_api", "training.json")


@pytest.fixture(scope="module")
def fx():
    with open(FIXTURES) as f:
        return json.load(f)


def f32(v):
    return np.array(v, dtype=np.float32)


def close(got, want, tol):
    got = np.asarray(got, np.float64).reshape(-1)
    want = np.asarray(want, np.float64).reshape(-1)
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err < tol, err


def test_adamw_matches_torch(fx):
    a = fx["adamw"]
    p = f32(a["param"])
    m, v = np.zeros_like(p), np.zeros_like(p)
    for step, g in enumerate(a["grads"], start=1):
        k.adamw_step(p, f32(g), m, v, step, lr=a["lr"], betas=(a["beta1"], a["beta2"]),
                     eps=a["eps"], weight_decay=a["weight_decay"])
    close(p, a["want_param"], 1e-6)
    close(m, a["want_exp_avg"], 1e-6)
    close(v, a["want_exp_avg_sq"], 1e-6)


def test_adamw_bf16_like_f16_gradients():
    rng = np.random.default_rng(3)
    p32 = rng.standard_normal(64).astype(np.float32)
    g16 = rng.standard_normal(64).astype(np.float16)
    p_a, m_a, v_a = p32.copy(), np.zeros(64, np.float32), np.zeros(64, np.float32)
    p_b, m_b, v_b = p32.copy(), np.zeros(64, np.float32), np.zeros(64, np.float32)
    k.adamw_step(p_a, g16, m_a, v_a, 1)
    k.adamw_step(p_b, g16.astype(np.float32), m_b, v_b, 1)
    close(p_a, p_b, 1e-7)


def test_adamw_refusals():
    p = np.ones(8, np.float32)
    with pytest.raises(ValueError):
        k.adamw_step(p, np.ones(8, np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32), 0)
    with pytest.raises(ValueError):
        k.adamw_step(p, np.ones(8, np.float32), np.zeros(8, np.float32),
                     np.zeros(8, np.float32), 1, betas=(1.0, 0.9))
    with pytest.raises(ValueError):
        k.adamw_step(p, np.ones(7, np.float32), np.zeros(8, np.float32), np.zeros(8, np.float32), 1)


def test_cross_entropy_matches_torch(fx):
    c = fx["cross_entropy"]
    logits = f32(c["logits"]).reshape(c["rows"], c["vocab"])
    targets = np.array(c["targets"], np.int32)
    loss, log_probs = k.cross_entropy(logits, targets, ignore_index=c["ignore_index"],
                                      log_probs=True)
    close(loss, c["want_loss"], 1e-6)
    assert loss[2] == 0 and loss[5] == 0  # the ignored rows
    close(log_probs, c["want_log_probs"], 1e-6)
    d = k.cross_entropy_backward(logits, targets, f32(c["dloss"]), ignore_index=c["ignore_index"])
    close(d, c["want_dlogits"], 1e-6)
    assert not d[2].any() and not d[5].any()


def test_cross_entropy_target_out_of_range():
    logits = np.random.default_rng(1).standard_normal((3, 10)).astype(np.float32)
    with pytest.raises(IndexError):
        k.cross_entropy(logits, np.array([1, 10, 2], np.int32))
    with pytest.raises(IndexError):
        k.cross_entropy_backward(logits, np.array([1, -3, 2], np.int32), np.ones(3, np.float32))


def test_clip_grad_norm_matches_torch(fx):
    for case in fx["clip"]:
        grads = [f32(g) for g in case["grads"]]
        norm = k.clip_grad_norm(grads, case["max_norm"])
        assert norm == pytest.approx(case["want_norm"], rel=1e-6)
        for got, want in zip(grads, case["want_grads"]):
            close(got, want, 1e-6)


def test_moe_aux_loss_matches_the_switch_transformer_definition():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    tokens, experts, top_k = 37, 8, 2
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    ids = np.argsort(-probs, axis=1)[:, :top_k].astype(np.int32)
    # Hugging Face's load_balancing_loss_func (Mixtral), one layer, no padding mask.
    p = torch.from_numpy(probs).double()
    expert_mask = torch.nn.functional.one_hot(torch.from_numpy(ids).long(), experts).double()
    tokens_per_expert = expert_mask.mean(dim=0)
    want = float((tokens_per_expert * p.mean(dim=0).unsqueeze(0)).sum() * experts)
    got = k.moe_aux_loss(probs.astype(np.float32), ids)
    assert float(got[0]) == pytest.approx(want, rel=1e-5)
    with pytest.raises(IndexError):
        bad = ids.copy()
        bad[3, 1] = experts
        k.moe_aux_loss(probs.astype(np.float32), bad)
