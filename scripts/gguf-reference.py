#!/usr/bin/env python3
"""Writes the GGUF dequantization fixtures that tests/base/test_gguf.cpp compares against.

The reference is the PyPI `gguf` package (llama.cpp's own Python reader, gguf-py), independent of
kvbench's C++ code:

  tests/fixtures/gguf/quants.json   a few blocks of every type kvbench dequantizes (F32, F16, BF16,
                                    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): the raw block
                                    bytes (hex) and gguf.quants.dequantize's float32 values. The
                                    32-element types are gguf.quants.quantize of random floats plus
                                    one block of random bytes; the K-quants (which gguf-py cannot
                                    quantize) are random bytes with finite fp16 scales.
  tests/fixtures/gguf/smollm2_blocks.json
                                    gguf.quants.dequantize of a few real blocks of the SmolLM2 Q4_1
                                    GGUF (a Q4_1 projection and the Q8_0 embedding), by tensor name
                                    and element offset; the file itself stays in ../shared.

  tests/fuzz/corpus/gguf/seed.gguf  a small GGUF written by gguf.GGUFWriter (metadata of several
                                    kinds, one tensor of each type above), the fuzzer's seed.

Floats are written as JSON numbers that round-trip float32 exactly, so the C++ test compares bits.
Run: /root/kvb-venv/bin/python scripts/gguf-reference.py [--models DIR]  (needs gguf and numpy).
"""

import argparse
import importlib.metadata
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "..", "tests", "fixtures", "gguf")

# Where each type keeps its fp16 scale fields (byte offsets in a block), to make random bytes finite.
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def floats(a):
    # float32 -> Python float is exact, and json writes the shortest repr that reads back the same.
    a = np.asarray(a, dtype=np.float32).reshape(-1)
    assert np.all(np.isfinite(a)), "fixture values must be finite (JSON has no NaN/inf)"
    return [float(x) for x in a]


def entry(qtype, raw, note):
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    block, size = GGML_QUANT_SIZES[qtype]
    assert raw.size % size == 0
    n = raw.size // size * block
    values = gguf.quants.dequantize(raw, qtype).reshape(-1)
    assert values.size == n
    return {"name": qtype.name, "type": int(qtype), "n": int(n), "note": note,
            "hex": raw.tobytes().hex(), "values": floats(values)}


def random_blocks(rng, qtype, n_blocks):
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for b in range(n_blocks):
        for off in FP16_FIELDS[qtype]:
            # Small scales of both signs, one of them subnormal in fp16.
            v = np.float16(rng.normal() * 0.05) if b != 1 else np.float16(-3.0e-6)
            raw[b, off:off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    return raw


def quants_fixture(rng):
    types = []
    # Plain floats: values chosen to cover signs, zero, subnormals, large magnitudes.
    x = rng.normal(size=60).astype(np.float32) * 3
    x = np.concatenate([x, np.array([0.0, -0.0, 1e-40, -65504.0], dtype=np.float32)])
    types.append(entry(T.F32, x.view(np.uint8), "random normals, +-0, an fp32 subnormal"))
    h = rng.integers(0, 0x10000, size=64, dtype=np.uint16)
    h = h[(h & 0x7C00) != 0x7C00]  # no inf/NaN
    h = np.concatenate([h, np.array([0x0001, 0x83FF, 0x8000, 0x7BFF], dtype=np.uint16)])
    types.append(entry(T.F16, h.view(np.uint8), "random finite fp16 bit patterns, subnormals, max"))
    b = rng.integers(0, 0x10000, size=64, dtype=np.uint16)
    b = b[(b & 0x7F80) != 0x7F80]
    b = np.concatenate([b, np.array([0x0001, 0x8000, 0x7F7F], dtype=np.uint16)])
    types.append(entry(T.BF16, b.view(np.uint8), "random finite bf16 bit patterns"))
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        data = (rng.normal(size=(3, 32)) * rng.uniform(0.01, 2.0, size=(3, 1))).astype(np.float32)
        q = gguf.quants.quantize(data, qtype)
        raw = np.concatenate([q.reshape(-1), random_blocks(rng, qtype, 2).reshape(-1)])
        types.append(entry(qtype, raw, "3 blocks gguf.quants.quantize(random normals), then 2 of "
                                       "random bytes"))
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        types.append(entry(qtype, random_blocks(rng, qtype, 2), "2 blocks of random bytes with "
                                                                "finite fp16 scales"))
    return types


def smollm2_fixture(models):
    path = os.path.join(models, "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    reader = gguf.GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    picks = [("blk.0.attn_q.weight", [0, 1, 5000]), ("blk.29.ffn_down.weight", [27647]),
             ("token_embd.weight", [0, 2705 * 18, 49151 * 18 + 17])]  # blocks; 18 per 576-row
    out = []
    for name, blocks in picks:
        t = by_name[name]
        qtype = T(int(t.tensor_type))
        block, size = GGML_QUANT_SIZES[qtype]
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        for k in blocks:
            b = raw[k * size:(k + 1) * size]
            out.append({"tensor": name, "type": qtype.name, "first_element": k * block,
                        "values": floats(gguf.quants.dequantize(b, qtype))})
    return out


def write_seed(rng, path):
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_array("tokenizer.ggml.tokens", ["<unk>", "a", "b"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0])
    w.add_string("general.name", "seed")
    w.add_tensor("f32", rng.normal(size=(2, 8)).astype(np.float32))
    w.add_tensor("f16", rng.normal(size=(8,)).astype(np.float16))
    for qtype in (T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        block, size = GGML_QUANT_SIZES[qtype]
        x = rng.normal(size=(2, 32)).astype(np.float32)
        w.add_tensor(qtype.name.lower(), gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        w.add_tensor(qtype.name.lower(), random_blocks(rng, qtype, 1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=os.path.join(HERE, "..", "..", "shared", "models"))
    args = ap.parse_args()
    made_by = {"gguf": importlib.metadata.version("gguf"),
               "numpy": importlib.metadata.version("numpy"),
               "script": "scripts/gguf-reference.py"}
    os.makedirs(OUT_DIR, exist_ok=True)
    rng = np.random.default_rng(20260)
    with open(os.path.join(OUT_DIR, "quants.json"), "w") as f:
        json.dump({"made_by": made_by, "types": quants_fixture(rng)}, f, indent=0)
        f.write("\n")
    with open(os.path.join(OUT_DIR, "smollm2_blocks.json"), "w") as f:
        json.dump({"made_by": made_by,
                   "file": "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
                   "blocks": smollm2_fixture(args.models)}, f, indent=0)
        f.write("\n")
    seeds = os.path.join(HERE, "..", "tests", "fuzz", "corpus", "gguf")
    os.makedirs(seeds, exist_ok=True)
    write_seed(rng, os.path.join(seeds, "seed.gguf"))
    print("wrote", OUT_DIR, "and", seeds, "with gguf", made_by["gguf"], file=sys.stderr)


if __name__ == "__main__":
    main()
