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


def test_arguments_are_checked_never_narrowed():
    s = cpu(weight_seed=4)
    s.prefill([1, 2, 3])
    want = s.generate(3)
    # Ids: integers fitting int32, nothing else; 2**32 + 5 is not 5.
    for bad, error in (([2**32 + 5], OverflowError), (np.array([2**32 + 5]), OverflowError),
                       ([-2**31 - 1], OverflowError), ([2**70], OverflowError),
                       ([1.0, 2.0], TypeError), (np.array([1.5]), TypeError),
                       (["1", "2"], TypeError), ([True], TypeError), ("12", TypeError),
                       (b"\x01", TypeError), ([[1, 2]], ValueError)):
        with pytest.raises(error):
            s.prefill(bad)
        with pytest.raises(error):
            s.complete(bad, max_new_tokens=1)
    # Slots fit int64 (2**64 + 1 is not slot 1), seeds int32 (2**32 is not seed 0).
    for kw, error in ((dict(slot=2**64 + 1), OverflowError), (dict(slot=1.0), TypeError),
                      (dict(seed=2**32), OverflowError), (dict(seed=-2**31 - 1), OverflowError),
                      (dict(seed=0.5), TypeError), (dict(slot=True), TypeError)):
        with pytest.raises(error):
            s.prefill([1, 2, 3], **kw)
    for bad in (2**64 + 1, 1.0, "0"):
        with pytest.raises((OverflowError, TypeError)):
            s.logits(slot=bad)
        with pytest.raises((OverflowError, TypeError)):
            s.release(slot=bad)
    with pytest.raises(OverflowError):
        s.generate(2**64 + 1)
    with pytest.raises(TypeError):
        s.generate(2.0)
    # Options too.
    for kw, error in ((dict(slots=2**64 + 1), OverflowError), (dict(slots=1.5), TypeError),
                      (dict(max_seq="32"), TypeError), (dict(weight_seed=-1), OverflowError),
                      (dict(weight_seed=2**64), OverflowError),
                      (dict(temperature=float("nan")), ValueError),
                      (dict(temperature=1e39), OverflowError),
                      (dict(temperature=1.0, top_k=2**31), OverflowError)):
        with pytest.raises(error):
            Session(backend="cpu", **kw)
    # A path holding a NUL is refused, not cut short at it.
    with pytest.raises(ValueError):
        Session("/tmp\0/whatever", backend="cpu")
    # Nothing above reached the C library: the session still decodes as before.
    s.prefill([1, 2, 3])
    assert s.generate(3) == want
    s.prefill(np.array([1, 2, 3], dtype=np.uint8))
    assert s.generate(3) == want


def test_encode_takes_text_only():
    s = cpu()
    for bad in (12345, 3.5, None, [104, 105]):
        with pytest.raises(TypeError):
            s.encode(bad)


def test_one_session_shared_by_threads_is_serialised():
    # Two threads on one handle used to run the C++ session at once and crash it.
    import threading

    # max_seq leaves room for many of the other thread's runs while a slot waits to be
    # released: a step advances every live slot.
    s = cpu(weight_seed=8, slots=2, max_seq=512)
    prompts = {0: [5, 6, 7], 1: [9, 10]}
    want = {}
    for slot, prompt in prompts.items():
        want[slot] = s.complete(prompt, max_new_tokens=6, slot=slot)
        s.release(slot=slot)
    got, errors = {}, []

    def work(slot):
        # One thread per slot: complete() and release() are two calls, so a second thread
        # on the same slot could run between them and continue the first one's sequence.
        # Each run ends its slot, so that the other thread's steps cannot run it out of
        # positions.
        try:
            for _ in range(15):
                out = s.complete(prompts[slot], max_new_tokens=6, slot=slot)
                got.setdefault(slot, []).append(out)
                s.release(slot=slot)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(slot,)) for slot in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # complete() is one locked call: every run is whole, whatever ran between.
    for slot, runs in got.items():
        assert all(r == want[slot] for r in runs), slot

    # close() from another thread waits for a call in progress, then later calls say so.
    s2 = cpu(weight_seed=8, max_seq=32)
    started = threading.Event()

    def long_call():
        started.set()
        try:
            s2.complete([1, 2], max_new_tokens=30)
        except SessionError:  # close() got the lock first
            pass

    t = threading.Thread(target=long_call)
    t.start()
    started.wait()
    s2.close()
    t.join()
    with pytest.raises(SessionError):
        s2.prefill([1])


def test_kernel_arguments_are_checked_never_narrowed():
    # The same rule for the kernel functions: every number is checked against its C type
    # before the call (ctypes alone would pass top_k = 2**32 + 5 as 5 and 1e39 as inf).
    import ctypes

    from stepgraph import kernels as k

    x = np.random.default_rng(3).random((2, 50), dtype=np.float32)
    seeds, pos = np.array([1, 2], np.int32), np.array([0, 0], np.int32)
    ids = k.sample(x, seeds, pos, 0.7, 5, 0.9)
    assert ids.shape == (2,)
    for kw, error in ((dict(top_k=2**32 + 5), ctypes.ArgumentError),
                      (dict(top_k=2.5), TypeError),
                      (dict(temperature=1e39), ctypes.ArgumentError)):
        args = dict(temperature=0.7, top_k=5, top_p=0.9)
        args.update(kw)
        with pytest.raises(error):
            k.sample(x, seeds, pos, **args)
