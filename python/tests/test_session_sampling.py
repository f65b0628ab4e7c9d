# Per-call sampling through stepgraph.Session (stepgraph_session_prefill_sampled): greedy ids
# under penalties and bias are the argmax of the step's logits penalised here from their
# definition; a logit bias forces or bans an id; a call's temperature is its own; stop
# strings end the text across token boundaries; every bad value is refused by name before
# the C call, and the C ABI refuses it by name too. On the built-in model, on the fixture
# model with a tokenizer, and on the real SmolLM2 file where it is fetched.
import ctypes
import math

import numpy as np
import pytest

from stepgraph import Session, SessionError, _lib

from test_session_text import fixture, new_tokens, smollm2_path, text_folder  # noqa: F401


def random_prompt(n, vocab, seed):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


class HostPenalties:
    """What a sequence's penalties do to its logits, from their definition (transformers'
    repetition penalty, OpenAI's presence and frequency penalties and logit bias), in
    float64, with the sequence's history kept here."""

    def __init__(self, prompt, repetition=1.0, presence=0.0, frequency=0.0, bias=None):
        self.prompt = set(prompt)
        self.times = {}
        self.r, self.a, self.f = repetition, presence, frequency
        self.bias = bias or {}

    def apply(self, logits):
        l = logits.astype(np.float64)
        for v in self.prompt | set(self.times):
            l[v] = l[v] / self.r if l[v] > 0 else l[v] * self.r
        for v, g in self.times.items():
            l[v] -= self.a + self.f * g
        for v, b in self.bias.items():
            l[v] += b
        return l

    def chose(self, i):
        self.times[i] = self.times.get(i, 0) + 1


def test_penalised_greedy_ids_are_the_argmax_of_the_penalised_logits():
    s = Session(None, backend="cpu", max_seq=48, weight_seed=5)
    # A long prompt, so that penalising its ids changes the greedy choice (the random model
    # seldom repeats what it generated).
    prompt = random_prompt(24, s.vocab_size, 4)
    plain = s.generate(prompt, max_new_tokens=20)
    for options in ({"repetition_penalty": 1.8},
                    {"repetition_penalty": 0.6},  # < 1 favours repeats
                    {"presence_penalty": 1.5, "frequency_penalty": 0.75,
                     "logit_bias": {17: 2.5, 400: -100.0}}):
        ref = HostPenalties(prompt, options.get("repetition_penalty", 1.0),
                            options.get("presence_penalty", 0.0),
                            options.get("frequency_penalty", 0.0), options.get("logit_bias"))
        s.prefill(prompt, **options)
        got = []
        for step in range(20):
            i = s.generate(1)[0]
            want = int(np.argmax(ref.apply(s.logits())))  # the first on ties, as Argmax
            assert i == want, (options, step)
            ref.chose(i)
            got.append(i)
        assert got != plain, options
        assert s.generate(prompt, max_new_tokens=20, **options) == got
        assert s.complete(prompt, max_new_tokens=20, **options) == got


def test_a_logit_bias_forces_or_bans_an_id():
    s = Session(None, backend="cpu", max_seq=32, weight_seed=3)
    prompt = [5, 6, 7]
    plain = s.generate(prompt, max_new_tokens=6)
    forced = 333 if plain[0] != 333 else 334
    assert s.generate(prompt, max_new_tokens=6, logit_bias={forced: 100.0}) == [forced] * 6
    assert s.generate(prompt, max_new_tokens=6, logit_bias={forced: 100}, temperature=2.0,
                      seed=9) == [forced] * 6
    banned = s.generate(prompt, max_new_tokens=6, logit_bias={plain[0]: -100.0})
    assert plain[0] not in banned
    # Nothing of a call stays: the next call without options is the session's again.
    assert s.generate(prompt, max_new_tokens=6) == plain


def test_a_calls_temperature_is_its_own():
    greedy = Session(None, backend="cpu", max_seq=32, weight_seed=8)
    prompt = random_prompt(5, greedy.vocab_size, 2)
    plain = greedy.generate(prompt, max_new_tokens=16)
    cold = greedy.generate(prompt, max_new_tokens=16, temperature=0.3, seed=4)
    hot = greedy.generate(prompt, max_new_tokens=16, temperature=8.0, seed=4)
    assert hot != cold and hot != plain
    assert greedy.generate(prompt, max_new_tokens=16, temperature=8.0, seed=4) == hot
    assert greedy.generate(prompt, max_new_tokens=16, temperature=8.0, seed=5) != hot
    # A call that samples draws what a session whose steps sample so draws, and a greedy
    # call (temperature 0) on a sampling session decodes as the greedy session does.
    sampled = Session(None, backend="cpu", max_seq=32, weight_seed=8, temperature=8.0)
    assert sampled.generate(prompt, max_new_tokens=16, seed=4) == hot
    assert sampled.generate(prompt, max_new_tokens=16, temperature=0) == plain
    # top_k and top_p default to the session's and shape a call's draws.
    assert greedy.generate(prompt, max_new_tokens=16, temperature=8.0, seed=4, top_k=1) == \
        plain
    narrow = Session(None, backend="cpu", max_seq=32, weight_seed=8, temperature=8.0, top_k=1)
    assert narrow.generate(prompt, max_new_tokens=16, temperature=8.0, seed=4) == plain
    assert narrow.generate(prompt, max_new_tokens=16, temperature=8.0, seed=4, top_k=0) == hot
    # Through a stream too.
    assert list(greedy.generate(prompt, max_new_tokens=16, temperature=8.0, seed=4,
                                stream=True)) == hot


def test_bad_sampling_is_refused_by_name():
    s = Session(None, backend="cpu", max_seq=16, weight_seed=1)
    v = s.vocab_size
    cases = [({"temperature": -1.0}, ValueError, "temperature"),
             ({"temperature": math.nan}, ValueError, "temperature"),
             ({"temperature": 1e39}, OverflowError, "temperature"),
             ({"temperature": 1.0, "top_k": -1}, ValueError, "top_k"),
             ({"temperature": 1.0, "top_k": 2.5}, TypeError, "top_k"),
             ({"temperature": 1.0, "top_p": 0.0}, ValueError, "top_p"),
             ({"temperature": 1.0, "top_p": 1.5}, ValueError, "top_p"),
             ({"top_k": 5}, ValueError, "temperature"),  # a greedy session: it would not apply
             ({"repetition_penalty": 0.0}, ValueError, "repetition_penalty"),
             ({"repetition_penalty": -1.0}, ValueError, "repetition_penalty"),
             ({"repetition_penalty": math.inf}, ValueError, "repetition_penalty"),
             ({"presence_penalty": 2.5}, ValueError, "presence_penalty"),
             ({"frequency_penalty": -2.01}, ValueError, "frequency_penalty"),
             ({"frequency_penalty": "1"}, TypeError, "frequency_penalty"),
             ({"min_p": 1.5}, ValueError, "min_p"),
             ({"min_p": -0.1}, ValueError, "min_p"),
             ({"logit_bias": {v: 1.0}}, ValueError, "logit_bias"),
             ({"logit_bias": {-1: 1.0}}, ValueError, "logit_bias"),
             ({"logit_bias": {3: 100.5}}, ValueError, "logit_bias"),
             ({"logit_bias": {3: math.nan}}, ValueError, "logit_bias"),
             ({"logit_bias": {i: 1.0 for i in range(65)}}, ValueError, "logit_bias"),
             ({"logit_bias": [(3, 1.0)]}, TypeError, "logit_bias"),
             ({"logit_bias": {3.0: 1.0}}, TypeError, "logit_bias")]
    for options, error, name in cases:
        for call in (lambda: s.generate([1, 2, 3], max_new_tokens=2, **options),
                     lambda: s.prefill([1, 2, 3], **options)):
            with pytest.raises(error) as e:
                call()
            assert name in str(e.value), (options, str(e.value))
    with pytest.raises(ValueError):
        s.generate(4, temperature=1.0)  # generate(n) continues: sampling belongs to a prompt
    with pytest.raises(ValueError) as e:
        s.generate([1, 2, 3], max_new_tokens=2, stop=["x"])  # stop strings need text
    assert "text" in str(e.value)
    # The edges are taken.
    s.generate([1, 2, 3], max_new_tokens=2, temperature=1.0, top_p=1.0, min_p=1.0,
               repetition_penalty=0.01, presence_penalty=-2, frequency_penalty=2,
               logit_bias={0: -100, v - 1: 100})


def test_the_c_abi_refuses_bad_fields_by_name():
    # Past the Python checks: the library's own, with the field in the message.
    s = Session(None, backend="cpu", max_seq=16, weight_seed=1)
    ids = (ctypes.c_int32 * 3)(1, 2, 3)
    for field, value in (("repetition_penalty", 0.0), ("presence_penalty", 3.0),
                         ("min_p", 2.0), ("top_p", 0.0), ("temperature", -1.0),
                         ("logit_bias_count", 65), ("mode", 7)):
        c = _lib.Sampling()
        assert s._lib.stepgraph_sampling_init(ctypes.byref(c)) == 0
        setattr(c, field, value)
        code = s._lib.stepgraph_session_prefill_sampled(s._handle, 0, ids, 3, 0, ctypes.byref(c))
        assert code == _lib.ERROR_INVALID_VALUE, field
        assert ("sampling." + field).encode() in s._lib.stepgraph_session_error(s._handle)


def test_stop_strings_end_the_text_across_tokens(text_folder):  # noqa: F811
    s = Session(text_folder, backend="cpu", max_seq=64)
    whole = s.generate("Hello", max_new_tokens=24, stop=False)
    pieces = list(s.generate("Hello", max_new_tokens=24, stop=False, stream=True))
    # A stop that straddles two pieces (two ids' text), and one that never comes.
    k = next(i for i in range(1, len(pieces)) if len(pieces[i - 1]) >= 2 and pieces[i])
    at = len("".join(pieces[:k]))
    stop = whole[at - 2:at + 1]
    want = whole[:whole.find(stop)]
    assert s.generate("Hello", max_new_tokens=24, stop=[stop]) == want
    assert "".join(s.generate("Hello", max_new_tokens=24, stop=stop, stream=True)) == want
    assert s.generate("Hello", max_new_tokens=24, stop=[stop, "\x00never"]) == want
    assert s.generate("Hello", max_new_tokens=24, stop=["\x00never"]) == whole
    with pytest.raises(ValueError, match="stop"):
        s.generate("Hello", stop=[""])
    # At most 4 strings of at most 256 bytes: matching stays linear in the text.
    assert s.generate("Hello", max_new_tokens=24, stop=["\x00a", "\x00b", "\x00c", "é" * 128]) == whole
    with pytest.raises(ValueError, match="at most 4"):
        s.generate("Hello", stop=["a", "b", "c", "d", "e"])
    with pytest.raises(ValueError, match="256 bytes"):
        s.generate("Hello", stop=["é" * 128 + "x"])


def test_smollm2_stop_strings_bias_and_penalties():
    s = Session(smollm2_path(), backend="cpu", max_seq=64)
    case = [c for c in fixture("smollm2", "expected.json")["cases"] if not c["chat"]][0]
    assert case["generated_text"].startswith(" Paris.\n\n")
    # "\n\n" is two ids (198, 198): the text ends before them.
    n = new_tokens(8)
    assert s.generate(case["text"], max_new_tokens=n, stop=["\n\n"]) == " Paris."
    assert "".join(s.generate(case["text"], max_new_tokens=n, stop="\n\n", stream=True)) == \
        " Paris."
    assert s.chat(case["text"] + "?", max_new_tokens=n, stop=["Paris"]) == \
        s.chat(case["text"] + "?", max_new_tokens=n).split("Paris")[0]
    # A logit bias of 100 makes " London" every id.
    london = s.encode(" London", add_special=False)
    assert len(london) == 1
    k = new_tokens(4)
    assert s.generate(case["text"], max_new_tokens=k, logit_bias={london[0]: 100.0}) == \
        " London" * k
    # A repetition penalty: each id the argmax of the penalised logits.
    prompt = case["prompt_ids"]
    ref = HostPenalties(prompt, repetition=1.5)
    s.prefill(prompt, repetition_penalty=1.5)
    got = []
    for _ in range(new_tokens(12)):
        i = s.generate(1)[0]
        assert i == int(np.argmax(ref.apply(s.logits())))
        ref.chose(i)
        got.append(i)
    assert got != case["generated"][:len(got)]
