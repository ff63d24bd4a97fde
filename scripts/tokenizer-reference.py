#!/root/kvb-venv/bin/python
"""Writes tests/fixtures/tokenizers/fuzz.json: a seeded fuzz set of strings and Hugging Face
`tokenizers`' ids for them (add_special_tokens=False) under three real tokenizer.json files, which
tests/base/test_tokenizer_json.cpp compares kvbench's tokenizer against; and toy.json, a small
tokenizer.json built here (added-token flags, Digits, ByteLevel with a prefix space, a BOS
template) with HF's ids for a few cases.

Usage: /root/kvb-venv/bin/python scripts/tokenizer-reference.py [--models DIR] [--n N] [--seed S]
DIR defaults to ../shared/models (or $KVBENCH_MODELS). Only ids and the generated strings are
written; nothing from the tokenizer files is copied.
"""
import argparse
import hashlib
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

FILES = {
    "llama3": "llama3-qwen2-tokenizers/llama3/tokenizer.json",
    "qwen2": "llama3-qwen2-tokenizers/qwen2/tokenizer.json",
    "smollm2": "smollm2-135m-instruct/tokenizer.json",
}

WORDS = ["the", "The", "THE", "hello", "world", "token", "naïve", "café", "Ångström", "straße",
         "don't", "I'M", "we'LL", "you're", "it's", "'s", "'t", "Mr.", "e.g.", "über", "façade",
         "résumé", "Δ", "Ωmega", "Привет", "мир", "שלום", "مرحبا", "नमस्ते", "สวัสดี", "γειά",
         "ǅemal", "ﬁne", "Ⅻ", "x²", "½", "①", "٣٤٥", "１２３", "１０.５"]
CJK = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
EMOJI = ["🦙", "🚀", "😀", "👍🏽", "👩‍👩‍👧", "🇫🇷", "❤️", "🧑‍💻", "🏳️‍🌈", "☕", "✨", "🙂"]
CODE = ["for (int i = 0; i < n; ++i) {", "    return x->y[i];", "def f(a, b=2):\n\treturn a**b",
        "#include <vector>", "if x != None and y >= 3:", "SELECT * FROM t WHERE id=42;",
        "\t\tcase 'a': break;", "x = [1,2,3]  # comment", "std::map<std::string, int> m;",
        "}\n\n", "=>", "...", "//", "/* */", "\\n", "0x1F", "3.14159", "1e-10", "$PATH", "@user"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2009",
          " \t ", "\n\n\n", "\u2028", "\u000b", "\u000c", "\u0085"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
            "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<repo_name>", "<file_sep>"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u1100\u1161\u11a8", "A\u030a"]


def rand_codepoint(rng):
    # Code points from many blocks; no surrogates, no noncharacters beyond what text may hold.
    blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0xe00, 0xe7f), (0x1100, 0x11ff), (0x2000, 0x206f), (0x2100, 0x21ff),
              (0x2460, 0x24ff), (0x3000, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
              (0xff00, 0xffef), (0x1f300, 0x1f6ff), (0x1d400, 0x1d7ff), (0x20000, 0x2a6df)]
    lo, hi = rng.choice(blocks)
    return chr(rng.randint(lo, hi))


def piece(rng):
    r = rng.random()
    if r < 0.25:
        return rng.choice(WORDS)
    if r < 0.35:
        return "".join(rng.choice(CJK) for _ in range(rng.randint(1, 6)))
    if r < 0.43:
        return rng.choice(EMOJI)
    if r < 0.53:
        return rng.choice(CODE)
    if r < 0.63:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))
    if r < 0.73:
        return "".join(rand_codepoint(rng) for _ in range(rng.randint(1, 5)))
    if r < 0.80:
        return rng.choice(SPECIALS)
    if r < 0.86:
        return rng.choice(COMBINING)
    return rng.choice(SPACES)


def fuzz_strings(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append(piece(rng))
            if rng.random() < 0.6:
                parts.append(rng.choice([" ", " ", " ", "", "\n", "  "]))
        out.append("".join(parts))
    return out


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def toy_tokenizer():
    """A small byte-level tokenizer.json exercising what the real files do not: added-token flags
    (lstrip, rstrip, single_word, normalized), Digits runs, ByteLevel with add_prefix_space and its
    own regex, [a, b] merges, a TemplateProcessing BOS, NFC."""
    chars = [bytes_to_unicode()[b] for b in range(256)]
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["i", "n"], ["in", "g"], ["1", "2"],
              ["12", "3"], ["Ġ", "w"], ["o", "r"], ["Ġw", "or"], ["Ġwor", "d"], ["Ã", "©"],
              ["Ġ", "Ġ"], ["Ċ", "Ċ"]]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    added = [("<s>", True, False, False, False, False), ("<mask>", True, True, False, False, False),
             ("[R]", True, False, True, False, False), ("word", False, False, False, True, False),
             ("<n>", False, False, False, False, True), ("é!", False, False, False, False, True)]
    added_tokens = [{"id": n + k, "content": c, "special": sp, "lstrip": ls, "rstrip": rs,
                     "single_word": sw, "normalized": nm}
                    for k, (c, sp, ls, rs, sw, nm) in enumerate(added)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [n], "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


def toy_spm_tokenizer():
    """A SentencePiece-style tokenizer.json (the Llama 2 converter's shape) with a normalized added
    token, whose content tokenizers normalizes (Prepend included) before matching, and an rstrip one."""
    sp = "\u2581"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in [sp, "a", "b", "d", "e", "h", "l", "o", "r", "t", "w", "x", "<", ">"]:
        vocab[c] = len(vocab)
    merges = [[sp, "t"], ["h", "e"], [sp + "t", "he"], ["l", "l"], [sp, "w"], ["o", "r"],
              [sp + "w", "or"], ["l", "d"], [sp + "wor", "ld"], ["h", "e"], [sp, "h"], ["e", "ll"],
              [sp + "h", "ell"], [sp + "hell", "o"]]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    added = [{"id": 0, "content": "<unk>", "special": True, "normalized": False},
             {"id": 1, "content": "<s>", "special": True, "normalized": False},
             {"id": 2, "content": "</s>", "special": True, "normalized": False},
             {"id": n, "content": "<x>", "special": False, "normalized": True},
             {"id": n + 1, "content": "[y]", "special": False, "normalized": False, "rstrip": True}]
    for a in added:
        for k in ["single_word", "lstrip", "rstrip"]:
            a.setdefault(k, False)
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": sp},
            {"type": "Replace", "pattern": {"String": " "}, "content": sp}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": sp}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


TOY_SPM_CASES = ["the world", "hello world", "hello <x> there", "hello<x>there", "<x>hello",
                 " <x>", "a [y]   b", "zzz \U0001F999 qq", "<s>the", "the <s> the", "  two  spaces ",
                 "", " ", "\u2581hello", "hello\nworld", "<x><x>", "caf\u00e9 \u4e2d"]


TOY_CASES = ["the word", "a <mask> b", "x  <mask>y", "[R]   z", "a[R] \n b", "sword word words",
             "word", "_word_", "wordy", "(word)", "the<n>the", "caf\u00e9! cafe\u0301! e\u0301!",
             "123 12345 1234567", "ab12cd", "<s>the", "the <s> the", "<mask><mask>", "   ",
             "\n\n\n", "thing thing", "word<mask>word"]


def write_toy(path, strings, doc, cases):
    tok = Tokenizer.from_str(json.dumps(doc))
    out = {"generator": "scripts/tokenizer-reference.py", "tokenizers_version": tokenizers.__version__,
           "tokenizer": doc, "cases": [
               {"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
                "ids_special": tok.encode(t, add_special_tokens=True).ids,
                "decoded": tok.decode(tok.encode(t, add_special_tokens=False).ids,
                                      skip_special_tokens=False)} for t in cases]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {len(cases)} toy cases", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--models", default=os.environ.get("KVBENCH_MODELS") or
                    os.path.join(here, "..", "..", "shared", "models"))
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "tokenizers",
                                                  "fuzz.json"))
    args = ap.parse_args()
    strings = fuzz_strings(args.n, args.seed)
    doc = {"generator": "scripts/tokenizer-reference.py", "seed": args.seed,
           "tokenizers_version": tokenizers.__version__, "add_special_tokens": False,
           "strings": strings, "files": {}, "ids": {}}
    for name, rel in FILES.items():
        path = os.path.join(args.models, rel)
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        tok = Tokenizer.from_file(path)
        doc["files"][name] = {"path": rel, "sha256": sha}
        doc["ids"][name] = [tok.encode(s, add_special_tokens=False).ids for s in strings]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        # One string / id list per line keeps diffs readable and the file small.
        f.write("{\n")
        for key in ["generator", "seed", "tokenizers_version", "add_special_tokens", "files"]:
            f.write(f"  {json.dumps(key)}: {json.dumps(doc[key], ensure_ascii=False)},\n")
        f.write('  "strings": [\n')
        f.write(",\n".join("    " + json.dumps(s, ensure_ascii=False) for s in strings))
        f.write('\n  ],\n  "ids": {\n')
        blocks = []
        for name in FILES:
            rows = ",\n".join("      " + json.dumps(ids, separators=(",", ":"))
                              for ids in doc["ids"][name])
            blocks.append(f'    "{name}": [\n{rows}\n    ]')
        f.write(",\n".join(blocks))
        f.write("\n  }\n}\n")
    fixtures = os.path.dirname(args.out)
    write_toy(os.path.join(fixtures, "toy.json"), strings, toy_tokenizer(), TOY_CASES + strings[:60])
    write_toy(os.path.join(fixtures, "toy_spm.json"), strings, toy_spm_tokenizer(),
              TOY_SPM_CASES + strings[:40])
    total = sum(len(x) for v in doc["ids"].values() for x in v)
    print(f"wrote {args.out}: {len(strings)} strings, {total} ids, tokenizers {tokenizers.__version__}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
