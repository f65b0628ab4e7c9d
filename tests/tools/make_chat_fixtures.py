#!/usr/bin/env python3
"""Makes tests/tools/fixtures/conversations.json for conversation_test.cc.

For each chat template of tests/fixtures/tokenizer/chat/ (with the bos and eos tokens
make_tokenizer_fixtures.py gives it), transformers' apply_chat_template(...,
add_generation_prompt=True, tokenize=False, date_string=...) of conversations of one, two
and three user turns with the answers between them, without and with a system message
(where the template takes one without raising). The program's chat renders the first turn
and then only what follows each answer; the test checks that the pieces add up to these.

    python3 tests/tools/make_chat_fixtures.py     (needs transformers)
"""

import json
import os

from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(HERE, "..", "fixtures", "tokenizer", "chat")
OUT = os.path.join(HERE, "fixtures", "conversations.json")

SPECIALS = {
    "smollm2": ("<|im_start|>", "<|im_end|>"), "qwen2": ("<|endoftext|>", "<|im_end|>"),
    "chatml_plain": ("<s>", "<|im_end|>"), "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama2": ("<s>", "</s>"), "mistral": ("<s>", "</s>"), "mistral_v3": ("<s>", "</s>"),
    "llama31": ("<|begin_of_text|>", "<|eot_id|>"), "llama32": ("<|begin_of_text|>", "<|eot_id|>"),
}
DATE = "02 Jan 2025"
USERS = ["What is the capital of France?", "  And of Italy?  ", "Multi\nline\n\nthird turn"]
ANSWERS = ["The capital of France is Paris.", "Rome."]
SYSTEM = "  You answer in one short sentence.\n"


def main():
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>",
                                         "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "a"])}
    base = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    out = {}
    for name, (bos, eos) in sorted(SPECIALS.items()):
        with open(os.path.join(CHAT, name + ".jinja"), encoding="utf-8") as f:
            template = f.read()
        hf = PreTrainedTokenizerFast(tokenizer_object=base, bos_token=bos, eos_token=eos)
        cases = []
        for system in (None, SYSTEM):
            renders = []
            for turns in (1, 2, 3):
                messages = [] if system is None else [{"role": "system", "content": system}]
                for i in range(turns):
                    messages.append({"role": "user", "content": USERS[i]})
                    if i + 1 < turns:
                        messages.append({"role": "assistant", "content": ANSWERS[i]})
                try:
                    renders.append(hf.apply_chat_template(
                        messages, chat_template=template, add_generation_prompt=True,
                        tokenize=False, date_string=DATE))
                except Exception:  # the template refuses a system message
                    renders = None
                    break
            if renders is not None:
                cases.append({"system": system, "renders": renders})
        out[name] = {"bos_token": bos, "eos_token": eos, "cases": cases}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"date_string": DATE, "users": USERS, "answers": ANSWERS, "templates": out}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
