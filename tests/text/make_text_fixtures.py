#!/usr/bin/env python3
"""Writes the reference fixtures of tests/text/hostile_text_test.cc from the `tokenizers`
library (the Rust tokenizer under transformers, which stepgraph's ids are checked against):

  split_regex.json   a byte-level BPE whose pre-tokenizer is one Split regex, and for
                     patterns that can match empty ($, \\b, \\z, a*, ...) the pieces and
                     ids the reference gives for a set of texts;
  nfc_reference.json [text, NFC] pairs from the reference's NFC normalizer, covering a
                     sample of every canonical combining class (three code points each,
                     among them marks newer than the reference's Unicode tables) in
                     every order against a mark of another class, compositions, and
                     the characters the reference's Unicode version lacks.

    pip install tokenizers && python3 tests/text/make_text_fixtures.py
"""
import json
import os
import random
import unicodedata

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))

PATTERNS = [r"$", r"\b", r"\z", r"\Z", r"a*", r"x*", r"^", r"(?=b)", r"\s*", r"", r"a|$",
            r"b*$", r"\p{L}*", r"[^a]*$"]
TEXTS = ["a", "ab", "bab", "bc", "aab ba\nab\n", "a\nb", "\u00e9", "a\u00e9b", " a b ",
         "\n\n", "abc xyz\n\nzyx cba", "  \n a"]


def byte_level_alphabet():
    """GPT-2's byte -> character table."""
    out, n = {}, 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def split_tokenizer(pattern):
    alphabet = byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    symbols = [alphabet[ord(c)] for c in "abcxyz \n"]
    merges = []
    for left in symbols:
        for right in symbols:
            merges.append((left, right))
            vocab.setdefault(left + right, len(vocab))
    e_acute = [alphabet[b] for b in "\u00e9".encode()]
    merges.append(tuple(e_acute))
    vocab["".join(e_acute)] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def make_split():
    cases = []
    for p in PATTERNS:
        tok = split_tokenizer(p)
        split = pre_tokenizers.Split(Regex(p), "isolated")
        for t in TEXTS:
            cases.append({"pattern": p, "text": t,
                          "pieces": [piece for piece, _ in split.pre_tokenize_str(t)],
                          "ids": tok.encode(t, add_special_tokens=False).ids})
    base = json.loads(split_tokenizer("PATTERN").to_str())
    return {"tokenizers_version": tokenizers.__version__, "tokenizer": base, "cases": cases}


def make_nfc():
    nfc = normalizers.NFC()
    by_class = {}
    for cp in range(0x110000):
        c = unicodedata.combining(chr(cp))
        if c:
            by_class.setdefault(c, []).append(cp)
    sample = []  # (class, code point): first, middle and last of each class
    for c, cps in sorted(by_class.items()):
        for cp in sorted({cps[0], cps[len(cps) // 2], cps[-1]}):
            sample.append((c, cp))
    cases = []
    # Every sampled mark on a base letter, before and after a mark of each other class
    # sampled: the canonical order of the two, or none where a mark has class 0 there.
    others = [cp for _, cp in sample]
    for _, cp in sample:
        for other in others[::7] + [0x0316, 0x0301, 0x0334, 0x05B0]:
            for s in ("a" + chr(cp) + chr(other), "a" + chr(other) + chr(cp)):
                cases.append(s)
    # Long runs of marks of two classes, out of order.
    cases.append("a" + "\u0301" * 40 + "\u0316" * 40)
    cases.append("\u0598\u1ac3")
    cases.append("a\u0598\u1ac3")
    # Decomposed spellings of precomposed characters, and the precomposed ones.
    rng = random.Random(7)
    decomposable = [cp for cp in range(0x110000)
                    if unicodedata.decomposition(chr(cp))
                    and not unicodedata.decomposition(chr(cp)).startswith("<")]
    for cp in decomposable[:40] + rng.sample(decomposable, 260):
        cases.append(chr(cp))
        cases.append(unicodedata.normalize("NFD", chr(cp)))
    # Hangul, computed rather than tabled.
    cases += ["\u1100\u1161", "\u1100\u1161\u11a8", "\uac00\u11a8", "\ud7a3"]
    seen, out = set(), []
    for s in cases:
        if s not in seen:
            seen.add(s)
            out.append([s, nfc.normalize_str(s)])
    return {"tokenizers_version": tokenizers.__version__, "cases": out}


def save(name, obj):
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    save("split_regex.json", make_split())
    save("nfc_reference.json", make_nfc())
