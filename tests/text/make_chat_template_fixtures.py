#!/usr/bin/env python3
"""Makes tests/fixtures/chat_templates/expected.json for jinja_test.cc.

Renders every chat template of tests/fixtures/chat_templates/ (real templates, taken from
the llama-cpp-python sdist on PyPI: vendor/llama.cpp/models/templates/*.jinja, and Phi-4's
from its tests/test-chat-template.cpp; Llama 3.3's template is byte for byte Llama 3.1's)
and of tests/fixtures/tokenizer/chat/ with transformers' apply_chat_template, for several
conversations (system and user; several turns with the assistant's answers; with and
without the generation prompt; text that needs escaping or trimming). A conversation
that the template refuses (raise_exception) is recorded as an error: stepgraph must
refuse it too.

    pip download --no-binary :all: --no-deps llama-cpp-python   (for the templates)
    python3 tests/text/make_chat_template_fixtures.py            (needs transformers)
"""

import json
import os

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
OUT = os.path.join(FIXTURES, "chat_templates", "expected.json")

# template file (relative to tests/fixtures) -> (bos token, eos token) of its model
TEMPLATES = {
    "chat_templates/qwen25.jinja": (None, "<|im_end|>"),
    "chat_templates/qwen3.jinja": (None, "<|im_end|>"),
    "chat_templates/qwq.jinja": (None, "<|im_end|>"),
    "chat_templates/mistral_nemo.jinja": ("<s>", "</s>"),
    "chat_templates/phi35.jinja": ("<s>", "<|endoftext|>"),
    "chat_templates/phi4.jinja": ("<|endoftext|>", "<|im_end|>"),
    "chat_templates/gemma2.jinja": ("<bos>", "<eos>"),
    "chat_templates/llama31.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "chat_templates/llama32.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "chat_templates/deepseek_r1_llama.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "chat_templates/deepseek_r1_qwen.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "chat_templates/smollm3.jinja": (None, "<|im_end|>"),
    "tokenizer/chat/smollm2.jinja": ("<|im_start|>", "<|im_end|>"),
    "tokenizer/chat/qwen2.jinja": ("<|endoftext|>", "<|im_end|>"),
    "tokenizer/chat/chatml_plain.jinja": ("<s>", "<|im_end|>"),
    "tokenizer/chat/llama3.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "tokenizer/chat/llama31.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "tokenizer/chat/llama32.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "tokenizer/chat/llama2.jinja": ("<s>", "</s>"),
    "tokenizer/chat/mistral.jinja": ("<s>", "</s>"),
    "tokenizer/chat/mistral_v3.jinja": ("<s>", "</s>"),
    "tokenizer/chat/refused_gemma.jinja": ("<bos>", "<eos>"),
    "tokenizer/chat/refused_phi3.jinja": ("<s>", "<|endoftext|>"),
}
DATE = "02 Jan 2025"
SYSTEM = "  You answer in one short sentence.\n"


def conversations():
    u = lambda text: {"role": "user", "content": text}
    a = lambda text: {"role": "assistant", "content": text}
    s = {"role": "system", "content": SYSTEM}
    return [
        ([u("What is the capital of France?")], True),
        ([s, u("What is the capital of France?")], True),
        ([s, u("What is the capital of France?")], False),
        ([u("Hi!"), a("Hello. How can I help?"), u("  And of Italy?  ")], True),
        ([s, u("Hi!"), a("Hello."), u("Multi\nline\n\nturn"), a(" Rome. "), u("Thanks")], True),
        ([s, u("Hi!"), a("Hello.")], False),
        ([u("Quotes ' \" and \\ and tags <b>&</b>, unicode é 日本 🙂\ttab")], True),
        ([u("Think first."), a("<think>\nI should answer.\n</think>\n\nParis."), u("Why?")], True),
        ([u("  padded  \n")], False),
    ]


def main():
    vocab = {t: i for i, t in enumerate(["<unk>", "a"])}
    base = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    out = {"date_string": DATE, "templates": {}}
    for path, (bos, eos) in sorted(TEMPLATES.items()):
        with open(os.path.join(FIXTURES, path), encoding="utf-8") as f:
            template = f.read()
        specials = {"eos_token": eos}
        if bos is not None:
            specials["bos_token"] = bos
        hf = PreTrainedTokenizerFast(tokenizer_object=base, **specials)
        cases = []
        for messages, prompt in conversations():
            case = {"messages": messages, "add_generation_prompt": prompt}
            try:
                case["text"] = hf.apply_chat_template(
                    messages, chat_template=template, add_generation_prompt=prompt,
                    tokenize=False, date_string=DATE)
            except Exception as e:  # the template refuses the conversation
                case["error"] = str(e)
            cases.append(case)
        out["templates"][path] = {"bos_token": bos or "", "eos_token": eos, "cases": cases}
        rendered = sum("text" in c for c in cases)
        print(f"{path}: {rendered} rendered, {len(cases) - rendered} refused")
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
