// The CUDA emulator's runtime (kvb_cuda_emu.h): a grid runs block by block on the calling host
// thread; the threads of a block are fibers (ucontext to start them, _setjmp/_longjmp to switch, so
// a switch costs no system call) run by a scheduler that sweeps them in a shuffled order until each
// blocks at a barrier or a shuffle, then releases whatever every participant has reached. Device
// memory is host memory from mmap, each allocation ending at a PROT_NONE guard page.

// glibc's fortified longjmp refuses to jump between stacks, which is all this file does.
#undef _FORTIFY_SOURCE

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvb_cuda_emu.h"

namespace kvb::emu {

thread_local ThreadCtx* g_thread = nullptr;

namespace {

constexpr size_t kFiberStack = 256 * 1024;
constexpr int kMaxThreads = 1024;

enum class State { kRunnable, kWarpWait, kBlockWait, kDone };

struct Fiber {
  int index = 0;  // linear thread index in the block
  ThreadCtx ctx;
  ucontext_t uc;
  jmp_buf jb;
  char* stack = nullptr;  // mmap'd, the lowest page a guard
  bool started = false;
  State state = State::kRunnable;
  uint64_t barriers = 0;  // __syncthreads reached
  uint64_t shuffles = 0;  // warp exchanges reached
  unsigned shuffle_mask = 0;
};

constexpr size_t kMaxGather = 64;  // bytes per lane of one all-gather

struct Warp {
  uint64_t slot[2][32];                     // [parity of the exchange][lane]
  unsigned char gather[2][32][kMaxGather];  // the same for all-gathers
  uint64_t mma_seq = 0;                     // the exchange whose mma_d is computed
  float mma_d[32][4];                       // its D fragments, per lane
};

// The one grid being run (run_grid holds g_mutex).
std::mutex g_mutex;
std::deque<Fiber> g_fibers;  // stable addresses: a ucontext_t points into itself
std::vector<Warp> g_warps;
Fiber* g_cur = nullptr;
jmp_buf g_sched;
void (*g_body)(void*) = nullptr;
void* g_closure = nullptr;
const char* g_kernel = "";
cudaError_t g_last_error = cudaSuccess;    // for cudaGetLastError
cudaError_t g_launch_error = cudaSuccess;  // for the next synchronize

char g_altstack[64 * 1024];

void report_fault(int sig) {
  char msg[512];
  if (g_thread) {
    const ThreadCtx& t = *g_thread;
    std::snprintf(msg, sizeof msg,
                  "\nkvbench CUDA emulator: %s in kernel %s, block (%u, %u, %u), thread (%u, %u, "
                  "%u): an access outside device memory (guard page) or a stack overflow\n",
                  sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", g_kernel, t.block_idx.x, t.block_idx.y,
                  t.block_idx.z, t.thread_idx.x, t.thread_idx.y, t.thread_idx.z);
  } else {
    std::snprintf(msg, sizeof msg, "\nkvbench CUDA emulator: %s outside any kernel\n",
                  sig == SIGSEGV ? "SIGSEGV" : "SIGBUS");
  }
  const ssize_t ignored = write(2, msg, std::strlen(msg));
  (void)ignored;
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_fault_handler() {
  static bool done = false;
  if (done) return;
  done = true;
  stack_t ss{};
  ss.ss_sp = g_altstack;
  ss.ss_size = sizeof g_altstack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = report_fault;
  sa.sa_flags = SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

[[noreturn]] void fiber_main() {
  g_body(g_closure);
  g_cur->state = State::kDone;
  _longjmp(g_sched, 1);
}

// Switches from the running fiber back to the scheduler (it resumes here when released).
void yield_to_scheduler(State s) {
  g_cur->state = s;
  if (_setjmp(g_cur->jb) == 0) _longjmp(g_sched, 1);
}

void resume(Fiber& f) {
  g_cur = &f;
  g_thread = &f.ctx;
  if (_setjmp(g_sched) == 0) {
    if (!f.started) {
      f.started = true;
      setcontext(&f.uc);
    }
    _longjmp(f.jb, 1);
  }
  g_thread = nullptr;
}

void ensure_fibers(int n) {
  while (static_cast<int>(g_fibers.size()) < n) {
    g_fibers.emplace_back();
    g_fibers.back().index = static_cast<int>(g_fibers.size()) - 1;
    void* mem = mmap(nullptr, kFiberStack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
      std::fprintf(stderr, "kvbench CUDA emulator: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(mem, static_cast<size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE);  // overflow faults
    g_fibers.back().stack = static_cast<char*>(mem);
    getcontext(&g_fibers.back().uc);  // once; each block only re-targets it (makecontext)
  }
}

std::string describe(const Fiber& f) {
  const char* what = f.state == State::kDone        ? "exited"
                     : f.state == State::kWarpWait  ? "at a shuffle"
                     : f.state == State::kBlockWait ? "at __syncthreads"
                                                    : "runnable";
  return "thread " + std::to_string(f.ctx.thread_idx.x) + " " + what + " (barrier #" +
         std::to_string(f.barriers) + ", shuffle #" + std::to_string(f.shuffles) + ")";
}

// Runs one block to completion; returns an empty string, or why the block cannot finish.
std::string run_block(int n, std::mt19937& rng) {
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  const int warps = (n + 31) / 32;
  for (;;) {
    for (int i : order)
      if (g_fibers[i].state == State::kRunnable) resume(g_fibers[i]);
    // Every fiber now waits or is done: release what all its participants have reached.
    bool released = false, all_done = true, any_block_wait = false;
    for (int w = 0; w < warps; ++w) {
      const int lo = w * 32, hi = std::min(n, lo + 32);
      int waiting = 0;
      for (int i = lo; i < hi; ++i) waiting += g_fibers[i].state == State::kWarpWait;
      if (waiting == 0) continue;
      const unsigned full = hi - lo == 32 ? 0xffffffffu : ((1u << (hi - lo)) - 1u);
      for (int i = lo; i < hi; ++i) {
        const Fiber& f = g_fibers[i];
        if (f.state != State::kWarpWait)
          return "a full-mask shuffle that not every lane of warp " + std::to_string(w) +
                 " reaches: " + describe(f) + ", " + describe(g_fibers[lo + (i == lo)]);
        if (f.shuffle_mask != full)
          return "shuffle mask " + std::to_string(f.shuffle_mask) + " with lanes " +
                 std::to_string(hi - lo) + " present (only full-warp masks are emulated)";
        if (f.shuffles != g_fibers[lo].shuffles)
          return "lanes of warp " + std::to_string(w) + " at different shuffles: " + describe(f) +
                 ", " + describe(g_fibers[lo]);
      }
      for (int i = lo; i < hi; ++i) g_fibers[i].state = State::kRunnable;
      released = true;
    }
    if (released) continue;
    for (int i = 0; i < n; ++i) {
      all_done &= g_fibers[i].state == State::kDone;
      any_block_wait |= g_fibers[i].state == State::kBlockWait;
    }
    if (all_done) return "";
    if (any_block_wait) {
      for (int i = 0; i < n; ++i)
        if (g_fibers[i].state != State::kBlockWait || g_fibers[i].barriers != g_fibers[0].barriers)
          return "a __syncthreads that not every thread reaches: " + describe(g_fibers[i]) + ", " +
                 describe(g_fibers[i == 0 ? 1 : 0]);
      for (int i = 0; i < n; ++i) g_fibers[i].state = State::kRunnable;
      continue;
    }
    return "deadlock";
  }
}

struct Allocation {
  void* base;
  size_t length;
};
std::map<void*, Allocation>& allocations() {
  static std::map<void*, Allocation> m;
  return m;
}
std::mutex g_alloc_mutex;

uint64_t g_block_serial = 0;                        // blocks run so far, all launches
std::unordered_map<void*, uint64_t> g_shared_seen;  // shared array -> block that poisoned it

}  // namespace

bool g_track_reads = false;
namespace {
std::unordered_set<uintptr_t> g_sectors;
}
void note_read(const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (uintptr_t s = a / 32; s <= (a + bytes - 1) / 32; ++s) g_sectors.insert(s);
}
void start_read_tracking() {
  g_sectors.clear();
  g_track_reads = true;
}
uint64_t stop_read_tracking() {
  g_track_reads = false;
  const uint64_t bytes = 32 * static_cast<uint64_t>(g_sectors.size());
  g_sectors.clear();
  return bytes;
}

void shared_declared(void* array, size_t bytes) {
  uint64_t& seen = g_shared_seen[array];
  if (seen != g_block_serial) {
    std::memset(array, 0xff, bytes);
    seen = g_block_serial;
  }
}

void syncthreads() {
  ++g_cur->barriers;
  yield_to_scheduler(State::kBlockWait);
}

int lane_id() { return g_cur->index % 32; }
namespace {
int f_lane() { return g_cur->index % 32; }
}  // namespace

void warp_exchange(unsigned mask, const void* in, void* out, size_t size, int src_lane) {
  Fiber& f = *g_cur;
  const int tid = f.index;
  Warp& w = g_warps[tid / 32];
  // Two slot sets by parity: a lane cannot reach exchange k + 2 before every lane has read k.
  uint64_t* slots = w.slot[f.shuffles & 1];
  if (size) std::memcpy(&slots[tid % 32], in, size);
  f.shuffle_mask = mask;
  ++f.shuffles;
  yield_to_scheduler(State::kWarpWait);
  if (size) std::memcpy(out, &slots[src_lane % 32], size);
}

void warp_allgather(unsigned mask, const void* in, size_t size, void* out) {
  if (size > kMaxGather) {
    std::fprintf(stderr, "kvbench CUDA emulator: warp all-gather of %zu bytes per lane\n", size);
    std::abort();
  }
  Fiber& f = *g_cur;
  Warp& w = g_warps[f.index / 32];
  unsigned char(*slots)[kMaxGather] = w.gather[f.shuffles & 1];
  std::memcpy(slots[f.index % 32], in, size);
  f.shuffle_mask = mask;
  ++f.shuffles;
  yield_to_scheduler(State::kWarpWait);
  for (int l = 0; l < 32; ++l)
    std::memcpy(static_cast<unsigned char*>(out) + l * size, slots[l], size);
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 with the PTX ISA's fragment layouts
// (groupID = lane / 4, t = lane % 4): A (16 x 16, f16x2 registers) a0 (row g, cols 2t, 2t+1), a1
// (row g + 8, same cols), a2 (row g, cols 2t + 8, 2t + 9), a3 (row g + 8, those cols); B (16 x 8)
// b0 (rows 2t, 2t + 1, col g), b1 (rows 2t + 8, 2t + 9, col g); C, D (16 x 8, f32) d0, d1 (row g,
// cols 2t, 2t + 1), d2, d3 (row g + 8, same cols). Products of fp16 values are exact in fp32; the
// sum runs in fp32 over k in order.
namespace {
void mma_m16n8k16_f32(float* d, const uint32_t* a, const uint32_t* b, float (*elem)(uint16_t));
}  // namespace

void mma_m16n8k16_f16_f32(float* d, const uint32_t* a, const uint32_t* b) {
  mma_m16n8k16_f32(d, a, b, ::kvb::kernels::half_to_float);
}
void mma_m16n8k16_bf16_f32(float* d, const uint32_t* a, const uint32_t* b) {
  mma_m16n8k16_f32(d, a, b, ::kvb::kernels::bf16_to_float);
}

namespace {
void mma_m16n8k16_f32(float* d, const uint32_t* a, const uint32_t* b, float (*elem)(uint16_t)) {
  struct Frag {
    uint32_t a[4], b[2];
    float c[4];
  };
  static_assert(sizeof(Frag) <= kMaxGather, "an mma fragment fits a gather slot");
  Fiber& f = *g_cur;
  Warp& w = g_warps[f.index / 32];
  unsigned char(*slots)[kMaxGather] = w.gather[f.shuffles & 1];
  Frag mine;
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  std::memcpy(mine.c, d, sizeof mine.c);
  std::memcpy(slots[f.index % 32], &mine, sizeof mine);
  f.shuffle_mask = 0xffffffffu;
  const uint64_t seq = ++f.shuffles;
  yield_to_scheduler(State::kWarpWait);
  if (w.mma_seq != seq) {  // the warp's first lane back computes D for all 32
    float A[16][16], B[16][8], C[16][8];
    auto lo = [&](uint32_t r) { return elem(static_cast<uint16_t>(r)); };
    auto hi = [&](uint32_t r) { return elem(static_cast<uint16_t>(r >> 16)); };
    for (int lane = 0; lane < 32; ++lane) {
      Frag fr;
      std::memcpy(&fr, slots[lane], sizeof fr);
      const int g = lane / 4, t = lane % 4;
      for (int half = 0; half < 2; ++half) {  // a0/a1: cols 2t.., a2/a3: cols 2t + 8..
        const int col = 2 * t + 8 * half;
        A[g][col] = lo(fr.a[2 * half]);
        A[g][col + 1] = hi(fr.a[2 * half]);
        A[g + 8][col] = lo(fr.a[2 * half + 1]);
        A[g + 8][col + 1] = hi(fr.a[2 * half + 1]);
        B[col][g] = lo(fr.b[half]);
        B[col + 1][g] = hi(fr.b[half]);
      }
      C[g][2 * t] = fr.c[0];
      C[g][2 * t + 1] = fr.c[1];
      C[g + 8][2 * t] = fr.c[2];
      C[g + 8][2 * t + 1] = fr.c[3];
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
      for (int i = 0; i < 4; ++i) {
        float acc = C[rows[i]][cols[i]];
        for (int k = 0; k < 16; ++k) acc += A[rows[i]][k] * B[k][cols[i]];
        w.mma_d[lane][i] = acc;
      }
    }
    w.mma_seq = seq;
  }
  std::memcpy(d, w.mma_d[f.index % 32], 4 * sizeof(float));
}

}  // namespace

void run_grid(const LaunchCfg& cfg, void (*body)(void*), void* closure) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const uint64_t n = static_cast<uint64_t>(cfg.block.x) * cfg.block.y * cfg.block.z;
  if (n == 0 || n > kMaxThreads || cfg.block.z > 64 || cfg.grid.x == 0 || cfg.grid.y == 0 ||
      cfg.grid.z == 0 || cfg.grid.y > 65535 || cfg.grid.z > 65535 || cfg.dynamic_smem > 0) {
    std::fprintf(stderr,
                 "kvbench CUDA emulator: launch of %s with grid (%u, %u, %u), block (%u, %u, %u), "
                 "%zu bytes of dynamic shared memory: invalid configuration%s\n",
                 cfg.name, cfg.grid.x, cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y,
                 cfg.block.z, cfg.dynamic_smem,
                 cfg.dynamic_smem > 0 ? " (dynamic shared memory is not emulated)" : "");
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  install_fault_handler();
  ensure_fibers(static_cast<int>(n));
  g_warps.resize((n + 31) / 32);
  g_body = body;
  g_closure = closure;
  g_kernel = cfg.name;
  std::mt19937 rng(0x6b7662u);  // the same thread order in every run of a test
  for (unsigned bz = 0; bz < cfg.grid.z; ++bz)
    for (unsigned by = 0; by < cfg.grid.y; ++by)
      for (unsigned bx = 0; bx < cfg.grid.x; ++bx) {
        ++g_block_serial;
        for (Warp& w : g_warps) w.mma_seq = 0;  // exchange numbers restart with the block
        for (int i = 0; i < static_cast<int>(n); ++i) {
          Fiber& f = g_fibers[i];
          const unsigned tx = i % cfg.block.x, ty = (i / cfg.block.x) % cfg.block.y,
                         tz = i / (cfg.block.x * cfg.block.y);
          f.ctx = ThreadCtx{uint3{tx, ty, tz}, uint3{bx, by, bz}, cfg.block, cfg.grid};
          f.started = false;
          f.state = State::kRunnable;
          f.barriers = f.shuffles = 0;
          f.uc.uc_stack.ss_sp = f.stack;
          f.uc.uc_stack.ss_size = kFiberStack;
          f.uc.uc_link = nullptr;
          makecontext(&f.uc, fiber_main, 0);
        }
        const std::string why = run_block(static_cast<int>(n), rng);
        if (!why.empty()) {
          std::fprintf(stderr, "kvbench CUDA emulator: kernel %s, block (%u, %u, %u): %s\n",
                       cfg.name, bx, by, bz, why.c_str());
          g_last_error = g_launch_error = cudaErrorLaunchFailure;
          g_cur = nullptr;
          return;
        }
      }
  g_cur = nullptr;
}

}  // namespace kvb::emu

using kvb::emu::g_last_error;
using kvb::emu::g_launch_error;

cudaError_t cudaGetDeviceCount(int* count) {
  *count = std::getenv("KVB_CUDA_EMU_NO_DEVICE") ? 0 : 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : (g_last_error = cudaErrorInvalidDevice);
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return g_last_error = cudaErrorInvalidDevice;
  if (attr != cudaDevAttrMultiProcessorCount) return g_last_error = cudaErrorInvalidValue;
  *value = 132;  // the H200's
  return cudaSuccess;
}

// The H200's SM count (split plans come out as on the GPU); a small L2, so that benchmarks that
// rotate input sets to defeat the L2 keep few of them.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return g_last_error = cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "kvbench CUDA emulator (CPU)");
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 1 << 20;
  prop->totalGlobalMem = size_t(8) << 30;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

struct CUevent_st {
  std::chrono::steady_clock::time_point t;
};
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st{std::chrono::steady_clock::now()};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  event->t = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t used = (std::max<size_t>(bytes, 1) + 15) / 16 * 16;
  const size_t data_pages = (used + page - 1) / page;
  const size_t length = (data_pages + 2) * page;  // guard, data, guard
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    *ptr = nullptr;
    return g_last_error = cudaErrorMemoryAllocation;
  }
  char* b = static_cast<char*>(base);
  mprotect(b, page, PROT_NONE);
  mprotect(b + (data_pages + 1) * page, page, PROT_NONE);
  char* p = b + (data_pages + 1) * page - used;  // ends at the trailing guard, 16-byte aligned
  std::memset(p, 0xff, used);
  std::lock_guard<std::mutex> lock(kvb::emu::g_alloc_mutex);
  kvb::emu::allocations()[p] = kvb::emu::Allocation{base, length};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(kvb::emu::g_alloc_mutex);
  auto& m = kvb::emu::allocations();
  const auto it = m.find(ptr);
  if (it == m.end()) return g_last_error = cudaErrorInvalidValue;
  munmap(it->second.base, it->second.length);
  m.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes) std::memset(dst, value, bytes);
  return cudaSuccess;
}

// Kernels run at launch; a failed launch is reported once by the next synchronize.
cudaError_t cudaDeviceSynchronize() {
  const cudaError_t e = g_launch_error;
  g_launch_error = cudaSuccess;
  return e;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }
cudaError_t cudaGetLastError() {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_last_error; }

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t err) { return cudaGetErrorName(err); }
