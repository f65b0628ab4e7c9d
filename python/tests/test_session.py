# stepgraph.Session over the session C ABI, on the built-in model and the CPU backend.
import numpy as np
import pytest

import stepgraph
from stepgraph import Session, SessionError


def cpu(**kw):
    kw.setdefault("backend", "cpu")
    kw.setdefault("slots", 2)
    kw.setdefault("max_seq", 32)
    return Session(**kw)


def test_readme_example():
    # The README's three lines.
    s = stepgraph.Session(backend="cpu")
    s.prefill([1, 2, 3])
    ids = s.generate(8)
    assert len(ids) == 8 and all(0 <= i < s.vocab_size for i in ids)
    assert s.backend == "cpu"


def test_greedy_ids_are_the_argmax_of_the_logits():
    with cpu(weight_seed=5) as s:
        s.prefill([7, 100, 3, 250], slot=1)
        for _ in range(4):
            (i,) = s.generate(1, slot=1)
            logits = s.logits(slot=1)
            assert logits.shape == (s.vocab_size,) and logits.dtype == np.float32
            assert np.all(np.isfinite(logits))
            assert i == int(np.argmax(logits))


def test_same_weights_same_ids_other_weights_other_logits():
    a, b, c = cpu(weight_seed=5), cpu(weight_seed=5), cpu(weight_seed=6)
    for s in (a, b, c):
        s.prefill([7, 100, 3, 250])
    assert a.generate(6) == b.generate(6)
    c.generate(6)
    assert not np.array_equal(a.logits(), c.logits())


def test_sampling_follows_the_seed():
    s = cpu(weight_seed=1, temperature=5.0)
    runs = []
    for seed in (3, 3, 4):
        s.prefill([9, 8, 7], seed=seed)
        runs.append(s.generate(12))
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_errors_carry_the_librarys_message():
    s = cpu()
    with pytest.raises(SessionError) as e:
        s.generate(1)
    assert str(e.value) and e.value.code == -2
    with pytest.raises(SessionError):
        s.prefill([1, 2], slot=2)
    with pytest.raises(SessionError):
        s.prefill([s.vocab_size])
    with pytest.raises(SessionError):
        s.prefill([])
    s.prefill([1, 2])
    with pytest.raises(SessionError):
        s.generate(100)  # past max_seq
    s.release()
    s.close()
    with pytest.raises(SessionError):
        s.generate(1)
    with pytest.raises(SessionError) as e:
        Session("/nonexistent/stepgraph-model", backend="cpu")
    assert "/nonexistent/stepgraph-model" in str(e.value)
    with pytest.raises(ValueError):
        Session(backend="tpu")


def test_cuda_backend_without_a_device_is_code_minus_one():
    if stepgraph.device_available():
        pytest.skip("a device is present")
    with pytest.raises(SessionError) as e:
        Session(backend="cuda")
    assert e.value.code == -1


def test_complete_is_prefill_then_generate():
    a, b = cpu(weight_seed=9), cpu(weight_seed=9)
    b.prefill([4, 5, 6])
    assert a.complete([4, 5, 6], max_new_tokens=5) == b.generate(5)
