# Text through stepgraph.Session: encode, decode, stop_ids and generate("text") against the
# tokenizer fixtures made with transformers (tests/fixtures/tokenizer) on a model folder made
# from fixtures, and against transformers' greedy text on the real SmolLM2-135M-Instruct file
# (tests/fixtures/fetch_smollm2.sh; those cases skip without it). Refusals: no tokenizer,
# text that is not UTF-8, ids outside the vocabulary.
import json
import os
import shutil

import pytest

import stepgraph
from stepgraph import Session, SessionError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def fixture(*parts):
    with open(os.path.join(FIXTURES, *parts), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    """The f32_gqa fixture model with the bl_smollm fixture tokenizer (a byte-level BPE of 700
    tokens trained like SmolLM's, ChatML specials at 0..2) and SmolLM2's chat template."""
    d = tmp_path_factory.mktemp("text_model")
    for src, dst in (("f32_gqa/config.json", "config.json"),
                     ("f32_gqa/generation_config.json", "generation_config.json"),
                     ("f32_gqa/model.safetensors", "model.safetensors"),
                     ("tokenizer/bl_smollm/tokenizer.json", "tokenizer.json"),
                     ("tokenizer/bl_smollm/tokenizer_config.json", "tokenizer_config.json"),
                     ("tokenizer/chat/smollm2.jinja", "chat_template.jinja")):
        shutil.copy(os.path.join(FIXTURES, src), d / dst)
    return str(d)


def test_encode_and_decode_are_transformers(text_folder):
    s = Session(text_folder, backend="cpu", max_seq=64)
    corpus = fixture("tokenizer", "corpus.json")
    expected = fixture("tokenizer", "bl_smollm", "expected.json")
    different = expected["decoded_where_different"]
    assert len(corpus) == len(expected["ids"])
    same = 0
    for i, text in enumerate(corpus):
        ids = s.encode(text)
        assert ids == expected["ids"][i], (i, text)
        back = s.decode(ids)
        assert back == different.get(str(i), text), i
        same += back == text
    assert same >= 300
    # The options reach the tokenizer.
    parsed, literal = s.encode("a<|im_end|>b"), s.encode("a<|im_end|>b", parse_special=False)
    assert 2 in parsed and 2 not in literal
    assert s.decode(parsed) == "a<|im_end|>b" and s.decode(parsed, skip_special=True) == "ab"
    assert s.encode(b"Hello") == s.encode("Hello")
    # Longer than the first guess of the buffer: the size-query path.
    assert s.decode([1] * 300) == "<|im_start|>" * 300


def test_chat_turns_are_the_templates(text_folder):
    s = Session(text_folder, backend="cpu", max_seq=64)
    for c in fixture("tokenizer", "chat", "expected.json")["smollm2"]["cases"]:
        assert s.decode(s.encode(c["user"], chat=True)) == c["text"]
    assert s.stop_ids() == [] and s.stop_ids(chat=True) == [2]


def test_bad_text_and_ids_are_refused(text_folder):
    s = Session(text_folder, backend="cpu", max_seq=64)
    for bad in (b"ab\xff", b"\xe2\x82", b"\xc0\xaf", "x\ud800y"):
        with pytest.raises(SessionError) as e:
            s.encode(bad)
        assert e.value.code == -2 and "UTF-8" in str(e.value)
    good = s.encode("Hello world")
    for bad_id in (700, -1, 2**31 - 1):
        with pytest.raises(SessionError) as e:
            s.decode(good[:1] + [bad_id] + good[1:])
        assert e.value.code == -2 and str(bad_id) in str(e.value)
    with pytest.raises(SessionError):
        s.encode("hi", chat=True, parse_special=False)
    with pytest.raises(OverflowError):
        s.decode([2**40])
    # A failure leaves the session usable.
    assert s.decode(good) == "Hello world"
    assert s.encode("") == [] and s.decode([]) == ""


def test_a_model_without_a_tokenizer_says_so():
    for model in (None, os.path.join(FIXTURES, "f32_gqa")):
        s = Session(model, backend="cpu", max_seq=32)
        with pytest.raises(SessionError) as e:
            s.generate("hello", max_new_tokens=4)
        assert e.value.code == Session.NO_TOKENIZER == -5
        assert ("built-in" if model is None else "tokenizer.json") in str(e.value)
        with pytest.raises(SessionError) as e:
            s.decode([1, 2])
        assert e.value.code == -5
        assert s.stop_ids() == []
        # Ids still run: in and out.
        out = s.generate([3, 4, 5], max_new_tokens=4)
        assert len(out) == 4 and all(0 <= i < s.vocab_size for i in out)


def test_generate_forms_and_their_checks():
    s = Session(backend="cpu", max_seq=16, weight_seed=3)
    a = s.generate([7, 8, 9], max_new_tokens=5)
    s.prefill([7, 8, 9])
    assert s.generate(5) == a  # the built-in model states no stop ids: nothing stops
    assert s.complete([7, 8, 9], max_new_tokens=5) == a
    # Stop at given ids: the output ends before the first of them.
    stopped = s.generate([7, 8, 9], max_new_tokens=5, stop=[a[2]])
    assert stopped == a[:a.index(a[2])]
    with pytest.raises(ValueError):
        s.generate([7, 8, 9], max_new_tokens=15)  # 3 + 15 - 1 positions > max_seq 16
    with pytest.raises(ValueError):
        s.generate([1, 2], chat=True)
    with pytest.raises(ValueError):
        s.generate(4, max_new_tokens=4)
    with pytest.raises(ValueError):
        s.generate([1, 2], max_new_tokens=0)


# ---- the real SmolLM2 file --------------------------------------------------------------

# Under the sanitizers (tools/test.sh sets STEPGRAPH_TEST_SANITIZED) the CPU reference runs
# about ten times slower: the generation tests then make a few tokens and compare that
# prefix of transformers' ids; the ordinary build runs the fixtures' 32.
SANITIZED = bool(os.environ.get("STEPGRAPH_TEST_SANITIZED"))


def new_tokens(full):
    return min(full, 6) if SANITIZED else full


def smollm2_path():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(cache, "stepgraph-test", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        pytest.skip("%s is absent: run tests/fixtures/fetch_smollm2.sh" % path)
    return path


def test_smollm2_text_is_transformers():
    s = Session(smollm2_path(), backend="cpu", max_seq=64)
    expected = fixture("tokenizer", "smollm2.expected.json")
    for i, text in enumerate(fixture("tokenizer", "corpus.json")):
        assert s.encode(text) == expected["ids"][i], (i, text)
    for c in fixture("smollm2", "expected.json")["cases"]:
        assert s.encode(c["text"], chat=c["chat"]) == c["prompt_ids"]
        assert s.decode(c["generated"], skip_special=True) == c["generated_text"]
    assert s.stop_ids() == s.stop_ids(chat=True) == s.encode("<|im_end|>")


def test_readme_text_example():
    # Text from the SmolLM2 file as the README's script asks for it (tools/install_test.sh
    # runs the script itself; backend "auto": the CPU reference here, where the text is
    # transformers' up to the model's end of sequence; a GPU's may part later on).
    s = stepgraph.Session(smollm2_path())
    n = new_tokens(32)
    text = s.generate("The capital of France is", max_new_tokens=n)
    case = fixture("smollm2", "expected.json")["cases"][0]
    end = min(n, case["generated"].index(2))
    want = s.decode(case["generated"][:end], skip_special=True)
    if s.backend == "cpu":
        assert text == want
    else:
        assert text.startswith(" Paris."), text


def test_smollm2_generates_transformers_text():
    # Greedy on the CPU reference: ids and text as transformers'.
    s = stepgraph.Session(smollm2_path(), backend="cpu", max_seq=48)
    case = fixture("smollm2", "expected.json")["cases"][0]
    assert not case["chat"]
    full = len(case["generated"])
    n = new_tokens(full)
    text = s.generate(case["text"], max_new_tokens=n, stop=False)
    if n == full:
        assert text == case["generated_text"]
    else:
        assert text == s.decode(case["generated"][:n], skip_special=True)
    assert s.generate(case["prompt_ids"], max_new_tokens=n, stop=False) == case["generated"][:n]
    # By default it stops before the model's end of sequence (<|im_end|>, id 2).
    if n == full:
        end = case["generated"].index(2)
        assert s.generate(case["text"], max_new_tokens=full) == \
            s.decode(case["generated"][:end], skip_special=True)


# ---- streams and chat -------------------------------------------------------------------

def test_a_stream_is_the_text_in_pieces(text_folder):
    s = Session(text_folder, backend="cpu", max_seq=64)
    # (The fixture model's vocabulary is the tokenizer's first 256 ids: "Hello" stays in it.)
    whole = s.generate("Hello", max_new_tokens=24, stop=False)
    pieces = list(s.generate("Hello", max_new_tokens=24, stop=False, stream=True))
    assert "".join(pieces) == whole and len(pieces) > 1
    assert all(pieces) and not any("\ufffd" in p for p in pieces if "\ufffd" not in whole)
    # Ids in, ids out, one at a time.
    prompt = s.encode("Hello")
    ids = s.generate(prompt, max_new_tokens=10, stop=False)
    assert list(s.generate(prompt, max_new_tokens=10, stop=False, stream=True)) == ids
    # A stop id ends the stream where it ends the whole.
    assert list(s.generate(prompt, max_new_tokens=10, stop=[ids[4]], stream=True)) == \
        ids[:ids.index(ids[4])]


def test_a_stream_holds_a_character_until_its_bytes_are_in(text_folder):
    # The fixture tokenizer spells most non-ASCII characters in byte tokens, so decoding a
    # prefix of their ids ends in U+FFFD: no piece may carry one, and the pieces are the text.
    s = Session(text_folder, backend="cpu", max_seq=64)
    text = "héllo wörld, 日本語 and ẞ"
    ids = s.encode(text, add_special=False)
    assert any("\ufffd" in s.decode(ids[:k]) for k in range(1, len(ids)))
    pieces = list(s._text_pieces(iter(ids)))
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_a_stream_interrupted_by_another_call_says_so(text_folder):
    s = Session(text_folder, backend="cpu", max_seq=64, slots=2)
    stream = s.generate([5, 6, 7], max_new_tokens=8, stop=False, stream=True)
    assert isinstance(next(stream), int)
    s.generate([8, 9], max_new_tokens=2, slot=1)  # steps every live slot, slot 0's too
    with pytest.raises(SessionError) as e:
        next(stream)
    assert "another call" in str(e.value) and "slot 0" in str(e.value)
    # A stream left unread holds nothing: the session goes on.
    s.generate([5, 6, 7], max_new_tokens=8, stream=True)
    assert len(s.generate([5, 6, 7], max_new_tokens=3, stop=False)) == 3


def test_conversations_render_as_transformers(text_folder):
    # Whole conversations (system message, earlier turns) through the template, as
    # transformers rendered them; what chat generates from them is checked on SmolLM2 below
    # (the fixture model's vocabulary is too small for the template's ids).
    s = Session(text_folder, backend="cpu", max_seq=96)
    cases = fixture("chat_templates", "expected.json")["templates"][
        "tokenizer/chat/smollm2.jinja"]["cases"]
    several = 0
    for c in cases:
        if c["add_generation_prompt"]:
            assert s.decode(s.encode_chat(c["messages"])) == c["text"], c["messages"]
            several += len(c["messages"]) > 1
    assert several >= 2
    assert s.encode_chat([{"role": "user", "content": "Hi"}]) == s.encode("Hi", chat=True)
    with pytest.raises(SessionError) as e:
        s.encode_chat([])
    assert "no messages" in str(e.value)
    with pytest.raises(SessionError) as e:  # refused by name, not dropped
        s.encode_chat([{"role": "user", "content": "Hi", "name": "x"}])
    assert '"name" is not taken' in str(e.value)
    for bad in ({"role": "user", "content": "Hi"}, [{"role": "user"}], [("user", "Hi")], 5,
                "Hi"):
        with pytest.raises(TypeError):
            s.encode_chat(bad)
    for bad in ({"role": "user", "content": "Hi"}, [{"role": "user"}], [("user", "Hi")], 5):
        with pytest.raises(TypeError):
            s.chat(bad)


def test_sampling_is_named_and_a_session_closes():
    with pytest.raises(TypeError):
        Session(None, "cpu")  # everything but the model by name
    with pytest.raises(ValueError) as e:
        Session(None, backend="cpu", top_k=5)  # top_k without a temperature would be ignored
    assert "temperature" in str(e.value)
    with Session(None, backend="cpu", max_seq=16, temperature=0.8, top_k=5, top_p=0.9,
                 weight_seed=2) as s:
        a = s.generate([1, 2, 3], max_new_tokens=6, seed=11)
        assert s.generate([1, 2, 3], max_new_tokens=6, seed=11) == a
        assert not s.closed
    assert s.closed
    with pytest.raises(SessionError) as e:
        s.generate([1, 2, 3], max_new_tokens=2)
    assert "closed" in str(e.value)


def test_smollm2_streams_and_chats_as_transformers():
    s = stepgraph.Session(smollm2_path(), backend="cpu", max_seq=96)
    cases = fixture("smollm2", "expected.json")["cases"]
    case = cases[0]
    n = new_tokens(len(case["generated"]))
    want = s.decode(case["generated"][:n], skip_special=True)
    pieces = list(s.generate(case["text"], max_new_tokens=n, stop=False, stream=True))
    assert "".join(pieces) == want and len(pieces) > 1
    # chat(): the template's user turn, as transformers rendered it; the reply ends at
    # <|im_end|> (id 2), in one piece or streamed.
    c = [c for c in cases if c["chat"]][0]
    k = new_tokens(len(c["generated"]))
    end = c["generated"].index(2) if 2 in c["generated"][:k] else k
    reply = s.decode(c["generated"][:end], skip_special=True)
    assert s.chat([{"role": "user", "content": c["text"]}], max_new_tokens=k) == reply
    assert "".join(s.chat(c["text"], max_new_tokens=k, stream=True)) == reply
    # A conversation of several turns: the reply is generate() of its rendered ids.
    talk = [{"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": c["text"]}]
    ids = s.encode_chat(talk)
    assert s.decode(ids).startswith("<|im_start|>system\nYou answer in one word.<|im_end|>")
    assert s.decode(ids).endswith("<|im_start|>assistant\n")
    want = s.decode(s.generate(ids, max_new_tokens=k, stop=s.stop_ids(chat=True)),
                    skip_special=True)
    assert s.chat(talk, max_new_tokens=k) == want and want
