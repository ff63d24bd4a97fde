#!/usr/bin/env bash
# Measures the CPU twins of the decode kernels (tests/bench/bench_kernels.cpp: paged fp16/bf16 dense
# and gathered, KIVI-4/2 decode, KIVI append) against the same process's 2-thread copy bandwidth,
# and the batched-decode matmul against the BLAS, and writes results/kernels-cpu.md with the
# machine, its load, the commit and the command. Needs the bench target (configure with
# -DKVB_BUILD_BENCH=ON). Run on an otherwise idle machine.
#   scripts/bench-kernels.sh [extra Google Benchmark flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${KVB_BENCH:-./${KVB_BUILD_DIR:-build}/tests/bench/kvb_bench}
[ -x "$BENCH" ] || { echo "bench-kernels: $BENCH not built (cmake -DKVB_BUILD_BENCH=ON, target kvb_bench)" >&2; exit 2; }
out=results/kernels-cpu.md
load=$(cut -d' ' -f1-3 /proc/loadavg)
json=$(mktemp)
trap 'rm -f "$json"' EXIT
"$BENCH" --benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_format=json "$@" > "$json"
python3 - "$json" "$out" "$load" "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with uncommitted changes')" "$*" <<'PY'
import json, sys
src, out, load, commit, extra = sys.argv[1:]
d = json.load(open(src))
ctx = d["context"]
rows = {}
for b in d["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    rows[b["run_name"]] = b
copy = rows.get("BM_CopyCeiling/2/real_time")
copy_gbs = copy["bytes_per_second"] / 1e9 if copy else None
NAMES = {
    "BM_Decode/batch:1/ctx:4096/gather:0/bf16:0/real_time": "paged fp16, batch 1, 4K",
    "BM_Decode/batch:1/ctx:32768/gather:0/bf16:0/real_time": "paged fp16, batch 1, 32K",
    "BM_Decode/batch:1/ctx:32768/gather:0/bf16:1/real_time": "paged bf16, batch 1, 32K",
    "BM_Decode/batch:4/ctx:8192/gather:0/bf16:0/real_time": "paged fp16, batch 4, 8K",
    "BM_Decode/batch:1/ctx:32768/gather:1/bf16:0/real_time": "gathered tokens (25%), batch 1, 32K",
    "BM_Decode/batch:1/ctx:32768/gather:2/bf16:0/real_time": "gathered pages (25%), batch 1, 32K",
    "BM_KiviDecode/batch:1/ctx:32768/bits:4/real_time": "KIVI-4, batch 1, 32K",
    "BM_KiviDecode/batch:1/ctx:32768/bits:2/real_time": "KIVI-2, batch 1, 32K",
    "BM_KiviDecode/batch:4/ctx:8192/bits:2/real_time": "KIVI-2, batch 4, 8K",
    "BM_KiviAppend/1/iterations:2048": "KIVI append, 1 token",
    "BM_KiviAppend/16/iterations:2048": "KIVI append, 16 tokens",
}
def ms(b):
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
    return b["real_time"] * scale
lines = []
w = lines.append
w("# CPU decode kernels: time per call against the copy bandwidth")
w("")
w("What: the CPU twins of the decode kernels (`decode_attention_cpu`: paged fp16/bf16, dense and")
w("gathered; `kivi_decode_cpu`: KIVI-4 / KIVI-2 pages + fp16 residual; `kivi_append_cpu`) in the Google")
w("Benchmark program `tests/bench/bench_kernels.cpp`: 8 KV heads, GQA 4, head_dim 128, random inputs")
w("rotated over 64 MiB, against a same-process 2-thread `memcpy` (bytes read + written).")
w("")
w(f"Machine: {ctx.get('num_cpus')} CPUs at {ctx.get('mhz_per_cpu')} MHz (host {ctx.get('host_name')}), "
  f"load average before the run {load}; commit {commit}; {ctx.get('date')}. Median of 3 repetitions.")
w("")
w("```")
w("scripts/bench-kernels.sh " + extra)
w("```")
w("")
w("| case | ms per call | GB/s read | fp16-equivalent GB/s | % of the copy bandwidth |")
w("|---|--:|--:|--:|--:|")
if copy:
    w(f"| copy ceiling, 2 threads (read + write) | | {copy_gbs:.1f} | | 100% |")
for name, label in NAMES.items():
    b = rows.get(name)
    if not b:
        continue
    gbs = b.get("bytes", 0) / 1e9
    fp16 = b.get("fp16_equiv", 0) / 1e9
    share = f"{100 * gbs / copy_gbs:.0f}%" if copy_gbs and gbs else ""
    t = ms(b)
    shown = f"{t * 1000:.1f} us" if t < 0.1 else f"{t:.2f}"
    eq = f"{fp16:.1f}" if fp16 and abs(fp16 - gbs) > 0.05 * gbs else ""
    w(f"| {label} | {shown} | {gbs:.1f} | {eq} | {share} |" if gbs else f"| {label} | {shown} | | | |")
w("")
w("\"% of the copy bandwidth\": bytes the kernel reads per second over the copy's bytes read + written")
w("per second, both measured in the same process. The KIVI rows' bytes are the packed codes")
w("and residual they read; an fp16 cache of the same context reads 4x (KIVI-4) to 8x (KIVI-2) more.")
w("")
w("How the kernels are built (kernels/cpu, kernels/include/kvb/kernels/detail): work items over token")
w("ranges of >= 512 positions across all KV heads (the ranges' softmax states merged at the end); per")
w("tile of 32 positions and per KV head, the query group's scores in register blocks of 4 heads x 2 rows")
w("and its value sums in blocks of 4 heads x 16 channels (`tile_attention.h`, an 8-lane vector type, the")
w("weights broadcast once per 32 rows), between them an online softmax with a vectorisable exp")
w("(`fast_exp.h`). The paged kernels read the fp16/bf16 rows straight from the pages and widen them in")
w("registers (F16C, `pool_rows.h`; an x86-64-v3 build of the work item beside the baseline one,")
w("`cpu_clones.h`) and prefetch the next tile's token rows into L2 (prefetcht1), a few cache lines per")
w("block of score rows; KIVI spreads its codes over lanes by shifts and dequantizes them in registers,")
w("its fp16 residual widened to fp32 tiles (`widen_rows.h`). `-ffp-contract=off`: every build of an")
w("item computes the baseline's bits.")
w("")
# The arithmetic floor: every cached token and KV head costs group x head_dim multiply-adds for its
# key and as many for its value, whatever the storage; 2 FP multiply and 2 FP add pipes of 8 lanes
# per core (no FMA: the clones keep the same bits) do 16 a cycle.
mhz = float(ctx.get("mhz_per_cpu") or 0)
cpus = int(ctx.get("num_cpus") or 0)
if mhz and cpus and copy_gbs:
    macs = 32768 * 8 * 4 * 128 * 2
    floor_ms = macs / (cpus * mhz * 1e6 * 16) * 1e3
    w(f"What bounds them: at 32K a batch-1 call does {macs / 1e6:.0f}M multiply-adds (8 KV heads x GQA 4 x")
    w(f"head_dim 128, keys and values), {floor_ms:.1f} ms at the arithmetic peak of {cpus} cores at {mhz:.0f} MHz")
    w("(16 multiply-adds a cycle each: two multiply and two add pipes of 8 lanes; no FMA, so that the")
    w("AVX2 and baseline clones compute the same bits). Half the copy figure is")
    rows_ms = []
    for name, label in [("BM_Decode/batch:1/ctx:32768/gather:0/bf16:0/real_time", "paged fp16"),
                        ("BM_KiviDecode/batch:1/ctx:32768/bits:4/real_time", "KIVI-4"),
                        ("BM_KiviDecode/batch:1/ctx:32768/bits:2/real_time", "KIVI-2")]:
        b = rows.get(name)
        if not b:
            continue
        need = (b.get("bytes", 0) * ms(b) / 1e3) / (0.5 * copy_gbs * 1e9) * 1e3
        below = ", below that floor" if need < floor_ms else ""
        rows_ms.append(f"{need:.1f} ms a call for {label} ({ms(b):.1f} ms measured{below})")
    w("; ".join(rows_ms) + ".")
    w("A KIVI call reads 4x to 8x fewer bytes than an fp16 one but does the same arithmetic (plus")
    w("unpacking the codes), so its share of the copy bandwidth is bounded by that peak, not by memory:")
    w("where half the copy figure asks for less than the floor, no fp32 code on these cores meets it.")
    # The paged fp16 call's cycles a position against the 512 of the peak (128 steps of 8 multiplies
    # and 8 adds), and its instruction profile (callgrind, measured at the commit that set this text).
    b = rows.get("BM_Decode/batch:1/ctx:32768/gather:0/bf16:0/real_time")
    if b:
        cyc = ms(b) / 1e3 * cpus * mhz * 1e6 / 32768
        need = (b.get("bytes", 0) * ms(b) / 1e3) / (0.5 * copy_gbs * 1e9) * 1e3
        met = "meets" if ms(b) <= need else "misses"
        w("")
        w(f"The paged fp16 kernel at 32K {met} half the copy figure: it took {cyc:.0f} core cycles a position")
        w(f"({cpus} cores), against 512 at that peak. Its instruction profile (callgrind, repeatable on a shared")
        w("machine: `valgrind --tool=callgrind ./build/tests/bench/kvb_bench")
        w("--benchmark_filter='BM_Decode/batch:1/ctx:32768/gather:0/bf16:0' --benchmark_min_time=0.01`): 136M")
        w("instructions a call, 4,150 a position (164M when the rows were widened into fp32 tiles in memory);")
        w("70% of them the two inner loops, a step of 8 multiplies and 8 adds of 8 lanes and 2 F16C conversions")
        w("in 21 instructions (scores) or 24 (value sums); 4% the prefetches, 2% the weight broadcasts, 24% the")
        w("rest (the score blocks' lane sums, the softmax, tile set-up). The 128 steps of a position fill the")
        w("two multiply and two add pipes for 512 cycles; the conversions, the loads and the instructions")
        w("around the loops share the same cores, and FMA would not raise that peak (two FMA pipes of 8 lanes")
        w("also do 16 multiply-adds a cycle). From memory, each position is 4 KiB of K and V.")
# The batched-decode matmul: one thread, rows x SmolLM2's gate/up projection, tiled kernel vs BLAS.
lin = {}
for name, b in rows.items():
    if name.startswith("BM_LinearRows/"):
        parts = dict(p.split(":") for p in name.split("/")[1:3])
        lin[(int(parts["rows"]), int(parts["tiled"]))] = b
if lin:
    core_peak = 32 * mhz / 1e3 if mhz else 0  # GFLOP/s: 16 multiply-adds a cycle
    w("")
    w("## Batched decode matmul: register-tiled kernel vs the BLAS")
    w("")
    w("What: `linear_f32`'s product for a few rows (one per sequence of a batched decode step) on one")
    w("thread: rows x SmolLM2-135M's gate/up projection (576 -> 1536, weights rotated over 64 MiB so")
    w("they come from memory as in a decode step). `gemm_nt_rows` (kernels/cpu/gemm_rows_cpu.cpp: tiles")
    w("of 3 rows x 3 weight rows in registers, each output gemv_n's dot product bit for bit) against")
    w("OpenBLAS's sgemm held to one thread; linear_f32 uses the tiled kernel up to `kMaxTiledRows` rows")
    w("(kernels/cpu/cpu_ops.cpp), set from this table.")
    w("")
    w("| rows | BLAS us | tiled us | BLAS GFLOP/s | tiled GFLOP/s | tiled / BLAS speed |" +
      (" tiled % of one core's peak |" if core_peak else ""))
    w("|--:|--:|--:|--:|--:|--:|" + ("--:|" if core_peak else ""))
    for r in sorted({k[0] for k in lin}):
        bl, ti = lin.get((r, 0)), lin.get((r, 1))
        if not (bl and ti):
            continue
        gb, gt = bl["flops"] / 1e9, ti["flops"] / 1e9
        row = f"| {r} | {ms(bl) * 1e3:.0f} | {ms(ti) * 1e3:.0f} | {gb:.1f} | {gt:.1f} | {gt / gb:.2f}x |"
        if core_peak:
            row += f" {100 * gt / core_peak:.0f}% |"
        w(row)
open(out, "w").write("\n".join(lines) + "\n")
print(open(out).read())
PY
