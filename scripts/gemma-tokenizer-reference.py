#!/usr/bin/env python3
"""Writes the Gemma GGUF tokenizer fixtures that tests/base/test_tokenizer_gguf_gemma.cpp compares
kvbench's GGUF SentencePiece tokenizer against:

  tests/fixtures/tokenizers/toy_gemma.gguf   a small vocabulary in Gemma 3's GGUF layout, made here
                                             (control tokens, user-defined newline and tab runs,
                                             byte fallback, no space prefix; pieces learned by a
                                             few BPE merges on this script's own word list)
  tests/fixtures/tokenizers/toy_gemma.json   the reference ids of hand-picked cases and of the fuzz
                                             set under that vocabulary (CI checks these), and of
                                             one user turn in Gemma's chat format ("chat")
  tests/fixtures/tokenizers/gemma3_gguf.json with --gemma-gguf: the reference ids of the fuzz set
                                             under the real Gemma 3 270M GGUF (sha256-pinned; the
                                             test runs where the optional asset is)

The reference is two implementations, which must agree on every string or the script stops:

  1. Hugging Face `tokenizers` running the tokenizer.json that transformers' own GemmaConverter
     builds from the vocabulary's SentencePiece ModelProto (how Gemma's tokenizer.json is made:
     BPE with merges from the piece scores, byte fallback, " " -> U+2581), with the vocabulary's
     control and unknown tokens as special added tokens, so that `<start_of_turn>`, `<bos>` and
     the like written in text are single tokens (Gemma's tokenizer_config.json lists them so);
  2. SentencePiece itself (the library Gemma's tokenizer.model is for) on that ModelProto, with the
     same control tokens and the user-defined ones cut out of the raw text first, longest at the
     leftmost place (SentencePiece alone never matches control tokens, nor the user-defined runs
     of spaces, which the GGUF stores as spaces: llama.cpp's converter takes them from
     tokenizer_config.json, where Hugging Face matches them in the raw text).

The ModelProto is rebuilt from the GGUF's tokenizer.ggml.* keys: pieces, scores and types as
stored (llama.cpp's token types are SentencePiece's), BPE, byte fallback, the identity
normalizer, no dummy prefix (tokenizer.ggml.add_space_prefix false), whitespace kept.

Not the reference: transformers' AutoTokenizer.from_pretrained(dir, gguf_file=...). Its GGUF
converter for Gemma (integrations/ggml.py, GGUFGemmaConverter) builds a Unigram model over the
scores, which in a SentencePiece BPE vocabulary are merge ranks, so it splits words into short
pieces ("capital" -> "c", "ap", "ital"): not the tokenizer the model was trained with. The
script prints how often it disagrees, for the record.

Only ids and generated strings are written; nothing of the real vocabulary is copied.

Usage (torch not needed: sentencepiece, tokenizers, transformers, protobuf, gguf):
  /root/kvb-torch/bin/python scripts/gemma-tokenizer-reference.py [--gemma-gguf FILE]
"""

import argparse
import hashlib
import importlib.util
import json
import os
import random
import sys
import tempfile

import gguf
import numpy as np
import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import AddedToken
from transformers.convert_slow_tokenizer import (GemmaConverter, GemmaSentencePieceExtractor,
                                                 import_protobuf)

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("tokref", os.path.join(HERE, "tokenizer-reference.py"))
tokref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tokref)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Gemma's special tokens and the text around them, for the fuzz strings.
GEMMA_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>",
                  "<unused0>", "<unused17>", "<start_of_image>", "<end_of_image>", "[multimodal]"]
NEAR_MISSES = ["<start_of_turn", "start_of_turn>", "<<start_of_turn>>", "<bos", "< bos>",
               "<BOS>", "<unused>", "<unused-1>", "</start_of_turn>", "<end_of_turn >"]
RUNS = ["\n", "\n\n", "\n\n\n", "\n\n\n\n\n\n", "\t", "\t\t", "\t\t\t\t", " \n", "\n ", "  \n\n  "]


def gemma_fuzz_strings(n, seed):
    """Strings with Gemma's specials, near misses and whitespace runs among tokenizer-reference.py's
    pieces, and a few chat turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 10 == 0:
            user = tokref.piece(rng) + " " + tokref.piece(rng)
            out.append(f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n")
            continue
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.2:
                parts.append(rng.choice(GEMMA_SPECIALS))
            elif r < 0.28:
                parts.append(rng.choice(NEAR_MISSES))
            elif r < 0.38:
                parts.append(rng.choice(RUNS))
            else:
                parts.append(tokref.piece(rng))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "\n", "  "]))
        out.append("".join(parts))
    return out


class Vocab:
    """A SentencePiece BPE vocabulary as a GGUF stores it."""

    def __init__(self, tokens, scores, types, bos, eos, unk, pad):
        self.tokens, self.scores, self.types = tokens, scores, types
        self.bos, self.eos, self.unk, self.pad = bos, eos, unk, pad

    @staticmethod
    def from_gguf(path):
        r = gguf.GGUFReader(path)
        f = r.fields

        def arr(key, conv):
            fl = f[key]
            return [conv(fl.parts[i]) for i in fl.data]

        def scalar(key):
            fl = f[key]
            return int(fl.parts[fl.data[0]][0])

        model = bytes(f["tokenizer.ggml.model"].parts[f["tokenizer.ggml.model"].data[0]]).decode()
        assert model == "llama", model
        space = f.get("tokenizer.ggml.add_space_prefix")
        assert space is not None and not bool(space.parts[space.data[0]][0]), "needs no space prefix"
        return Vocab(arr("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8")),
                     arr("tokenizer.ggml.scores", lambda p: float(p[0])),
                     arr("tokenizer.ggml.token_type", lambda p: int(p[0])),
                     scalar("tokenizer.ggml.bos_token_id"), scalar("tokenizer.ggml.eos_token_id"),
                     scalar("tokenizer.ggml.unknown_token_id"),
                     scalar("tokenizer.ggml.padding_token_id"))

    def model_proto(self):
        pb = import_protobuf()
        m = pb.ModelProto()
        for i, (t, s, ty) in enumerate(zip(self.tokens, self.scores, self.types)):
            p = m.pieces.add()
            p.piece, p.score = t, s
            p.type = UNKNOWN if i == self.unk else ty
        ts = m.trainer_spec
        ts.model_type = pb.TrainerSpec.BPE
        ts.byte_fallback = True
        ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = self.unk, self.bos, self.eos, self.pad
        ns = m.normalizer_spec
        ns.name = "identity"
        ns.add_dummy_prefix = False
        ns.remove_extra_whitespaces = False
        ns.escape_whitespaces = True
        return m.SerializeToString()

    def specials(self):
        """The special tokens: control and unknown, as the file types them."""
        return [t for t, ty in zip(self.tokens, self.types) if ty in (CONTROL, UNKNOWN)]

    def matched_in_text(self):
        """Every token cut out of the raw text before the model runs: the special ones and the
        user-defined ones (Gemma's runs of newlines, tabs and spaces; the spaces stored as spaces,
        so SentencePiece's normalized text, where they are U+2581, never holds them)."""
        return self.specials() + [t for t, ty in zip(self.tokens, self.types)
                                  if ty == USER_DEFINED]


class _Extractor(GemmaSentencePieceExtractor):
    # transformers 5.2's GemmaSentencePieceExtractor reads self.sp, which its base class no longer
    # sets; the processor it expects is the model file's.
    def __init__(self, model):
        super().__init__(model)
        self.sp = spm.SentencePieceProcessor(model_file=model)


class _GemmaConverter(GemmaConverter):
    SpmExtractor = _Extractor


class Reference:
    def __init__(self, vocab):
        self.vocab = vocab
        proto = vocab.model_proto()
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        with tempfile.NamedTemporaryFile(suffix=".model", delete=False) as f:
            f.write(proto)
            path = f.name

        class Original:  # what GemmaConverter reads of a slow tokenizer
            vocab_file = path
            pad_token = vocab.tokens[vocab.pad]
            eos_token = vocab.tokens[vocab.eos]
            bos_token = vocab.tokens[vocab.bos]
            unk_token = vocab.tokens[vocab.unk]
            add_prefix_space = False
            legacy = False

        self.hf = _GemmaConverter(Original()).converted()
        os.unlink(path)
        self.hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in vocab.specials()])
        self.by_first = {}
        for t in sorted(set(vocab.matched_in_text()), key=len, reverse=True):
            self.by_first.setdefault(t[0], []).append(t)
        self.ids = {t: i for i, t in enumerate(vocab.tokens)}

    def spm_ids(self, text):
        out, start, i = [], 0, 0
        while i < len(text):
            hit = next((t for t in self.by_first.get(text[i], []) if text.startswith(t, i)), None)
            if hit is None:
                i += 1
                continue
            if i > start:
                out += self.sp.encode(text[start:i])
            out.append(self.ids[hit])
            i += len(hit)
            start = i
        if start < len(text):
            out += self.sp.encode(text[start:])
        return out

    def ids_of(self, text):
        a = self.hf.encode(text, add_special_tokens=False).ids
        b = self.spm_ids(text)
        if a != b:
            raise SystemExit(f"the references disagree on {text!r}:\n  tokenizers   {a}\n"
                             f"  sentencepiece {b}")
        return a


def toy_vocab():
    """Gemma's layout in small: control tokens first, user-defined runs, bytes, then characters and
    pieces from BPE merges learned on tokenizer-reference.py's word list and a few sentences."""
    sp = "\u2581"
    controls = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
                "<unused0>", "<unused17>"]
    users = ["[multimodal]", "\n", "\n\n", "\n\n\n", "\t", "\t\t", "<start_of_image>",
             "<end_of_image>"]
    corpus = tokref.WORDS + ["the capital of France is Paris", "once upon a time there lived",
                             "user model turn start end of the", "hello world 12 345"]
    words = [sp + w.replace(" ", sp) for w in corpus]
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz0123456789.,!?'"))
    seqs = [list(w) for w in words]
    merges = []
    for _ in range(120):
        counts = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        (a, b), c = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        if c < 2:
            break
        merges.append(a + b)
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i:i + 2] = [a + b]
                i += 1
    tokens, scores, types = [], [], []
    for t in controls:
        tokens.append(t), scores.append(-1000.0), types.append(CONTROL)
    for t in users:
        tokens.append(t), scores.append(-1000.0), types.append(USER_DEFINED)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>"), scores.append(0.0), types.append(BYTE)
    for k, t in enumerate(merges):
        if t not in tokens:
            tokens.append(t), scores.append(-float(k)), types.append(NORMAL)
    for k, c in enumerate(chars):
        if c not in tokens:
            tokens.append(c), scores.append(-1000.0 - k), types.append(NORMAL)
    return Vocab(tokens, scores, types, bos=2, eos=1, unk=3, pad=0)


def write_toy_gguf(vocab, path):
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab.tokens)
    w.add_token_scores([float(s) for s in vocab.scores])
    w.add_token_types(vocab.types)
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    w.add_unk_token_id(vocab.unk)
    w.add_pad_token_id(vocab.pad)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TOY_CASES = ["<start_of_turn>user\nthe capital of France is<end_of_turn>\n<start_of_turn>model\n",
             "<bos>hello world", "hello<eos>", "<start_of_turn", "<<start_of_turn>>",
             "<unused17><unused0>", "<unk>", "a\n\n\nb\n\n\n\nc", "\t\t\tx", "[multimodal] y",
             "<start_of_image>z<end_of_image>", "once upon a time", "  two  spaces ", "", " ",
             "\u00e9t\u00e9 \u4e2d\u6587 \U0001F999", "12 345 6789", "<mask>", "the<pad>the"]


# One user turn as Gemma's chat template renders it with add_generation_prompt (its bos_token, the
# message trimmed): the ids of the whole rendered string are what apply_chat_template(tokenize=True)
# gives, which kvbench's segment-by-segment rendering must equal.
CHAT_MESSAGES = ["What is the capital of France?", "Hi", "Line one.\n\nLine two:\tend",
                 "Write <start_of_turn> as text?"]


def gemma_turn(message):
    return f"<bos><start_of_turn>user\n{message.strip()}<end_of_turn>\n<start_of_turn>model\n"


def chat_cases(ref):
    return [{"message": m, "rendered": gemma_turn(m), "ids": ref.ids_of(gemma_turn(m))}
            for m in CHAT_MESSAGES]


def dump(path, doc, strings_key="strings"):
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for k, v in doc.items():
            if k in (strings_key, "ids"):
                continue
            f.write(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},\n")
        f.write(f'  "{strings_key}": [\n')
        f.write(",\n".join("    " + json.dumps(s, ensure_ascii=False) for s in doc[strings_key]))
        f.write('\n  ],\n  "ids": [\n')
        f.write(",\n".join("    " + json.dumps(x, separators=(",", ":")) for x in doc["ids"]))
        f.write("\n  ]\n}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "fixtures", "tokenizers"))
    ap.add_argument("--gemma-gguf", help="the Gemma 3 270M GGUF: write gemma3_gguf.json too")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=20261204)
    args = ap.parse_args()
    strings = gemma_fuzz_strings(args.n, args.seed)
    versions = {"tokenizers_version": tokenizers.__version__,
                "sentencepiece_version": spm.__version__,
                "transformers_version": transformers.__version__}

    toy = toy_vocab()
    write_toy_gguf(toy, os.path.join(args.out, "toy_gemma.gguf"))
    ref = Reference(toy)
    cases = TOY_CASES + strings[:150]
    dump(os.path.join(args.out, "toy_gemma.json"),
         dict(generator="scripts/gemma-tokenizer-reference.py", seed=args.seed, **versions,
              vocab_size=len(toy.tokens), chat=chat_cases(ref), strings=cases,
              ids=[ref.ids_of(s) for s in cases]))
    print(f"toy_gemma: {len(toy.tokens)} tokens, {len(cases)} strings", file=sys.stderr)

    if args.gemma_gguf:
        with open(args.gemma_gguf, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        real = Reference(Vocab.from_gguf(args.gemma_gguf))
        ids = [real.ids_of(s) for s in strings]
        dump(os.path.join(args.out, "gemma3_gguf.json"),
             dict(generator="scripts/gemma-tokenizer-reference.py", seed=args.seed, **versions,
                  file=os.path.basename(args.gemma_gguf), sha256=sha, chat=chat_cases(real),
                  strings=strings, ids=ids))
        # For the record: how far transformers' own GGUF tokenizer is from both.
        d, name = os.path.split(os.path.abspath(args.gemma_gguf))
        hf_gguf = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
        differ = sum(hf_gguf.encode(s, add_special_tokens=False) != x for s, x in zip(strings, ids))
        print(f"gemma3_gguf: {len(strings)} strings, {sum(map(len, ids))} ids; transformers' "
              f"GGUF tokenizer differs on {differ} of them", file=sys.stderr)


if __name__ == "__main__":
    main()
