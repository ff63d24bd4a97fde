#pragma once
// kvbench's CUDA emulator: just enough of CUDA C++ (the runtime API, fp16/bf16, vector types, the
// thread hierarchy, __syncthreads and warp shuffles) for the kernels of kernels/cuda to compile
// with the host C++ compiler and run on the CPU, one CUDA thread per fiber. The shims in include/
// stand in for <cuda_runtime.h>, <cuda_runtime_api.h>, <cuda_fp16.h> and <cuda_bf16.h>, so the
// kernel sources are compiled unchanged (launches go through KVB_LAUNCH, common.cuh).
//
// What it checks that a plain CPU twin cannot: the kernels' own indexing, lane and slot arithmetic,
// shuffle reductions, shared-memory hand-offs and bit-level quantization, against the same oracles
// as on a GPU. On top of that every launch is checked for barrier divergence (a __syncthreads or a
// full-mask shuffle that not every thread reaches, and deadlock), device allocations sit against
// PROT_NONE guard pages (a read or write past the end faults, and the fault names the kernel, block
// and thread), fresh allocations and shared memory are filled with 0xff bytes (NaN in fp16, bf16
// and fp32) so a read of something never written shows, and the threads of a block run in a
// shuffled order so a missing barrier shows as a wrong result.
//
// What it cannot check: anything about speed, the memory model (the threads of a block interleave
// only at barriers and shuffles, so races are not found by it), register or shared-memory limits,
// and the GPU's own math (exp2f, fmaf and conversions are the host's: results agree with a GPU's
// to rounding, not bit for bit, except the conversions, which round exactly as CUDA's do).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kvb/kernels/half.h"

#define KVB_CUDA_EMU 1

// ---- qualifiers ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Static storage: blocks run one at a time, on one host thread. The build copies every CUDA source
// through emu_rewrite.cmake, which follows each __shared__ array's declaration with
// kvb::emu::shared_declared(name, sizeof name): the first thread of a block to get there fills it
// with 0xff bytes, so a read of shared memory that the block never wrote is NaN, not a value left
// by the previous block.
#define __shared__ static

// ---- runtime API types ----
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
};
typedef enum cudaError cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
struct CUstream_st;
typedef CUstream_st* cudaStream_t;
struct CUevent_st;
typedef CUevent_st* cudaEvent_t;  // a host clock reading (kernels run at launch)
struct cudaDeviceProp {
  char name[256];
  int multiProcessorCount;
  int l2CacheSize;
  size_t totalGlobalMem;
  int major, minor;
};

// ---- vector types ----
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(8) float2 {
  float x, y;
};
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}

// ---- fp16 / bf16: storage types and the conversions the kernels use (round to nearest even, as
// the GPU's) ----
struct alignas(2) __half {
  unsigned short __x;
};
struct alignas(4) __half2 {
  __half x, y;
};
struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
};
inline float __half2float(__half h) { return ::kvb::kernels::half_to_float(h.__x); }
inline __half __float2half_rn(float f) { return __half{::kvb::kernels::float_to_half(f)}; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline __half2 __hsub2(__half2 a, __half2 b) {
  return __half2{__float2half_rn(__half2float(a.x) - __half2float(b.x)),
                 __float2half_rn(__half2float(a.y) - __half2float(b.y))};
}
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __bfloat162float(__nv_bfloat16 b) { return ::kvb::kernels::bf16_to_float(b.__x); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16{::kvb::kernels::float_to_bf16(f)};
}

// ---- integer / float intrinsics ----
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {x, y} (PRMT's default mode).
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned int r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<unsigned int>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }  // ties to even
namespace kvb::emu {
extern bool g_track_reads;
void note_read(const void* p, size_t bytes);
// Counting the distinct 32-byte sectors that __ldg reads (a GPU's DRAM transaction unit), to check
// a benchmark's byte accounting: start, launch, stop (returns the bytes of the sectors touched).
void start_read_tracking();
uint64_t stop_read_tracking();
}  // namespace kvb::emu
template <typename T>
inline T __ldg(const T* p) {
  if (::kvb::emu::g_track_reads) ::kvb::emu::note_read(p, sizeof(T));
  return *p;
}
// CUDA's global min / max overloads (device code calls them unqualified).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }

// ---- the thread hierarchy, barriers and shuffles (cuda_emu.cpp) ----
namespace kvb::emu {

struct ThreadCtx {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
extern thread_local ThreadCtx* g_thread;  // the running CUDA thread of this host thread

void syncthreads();
void shared_declared(void* array, size_t bytes);
// Every lane of the calling thread's warp deposits `size` bytes; after all lanes named in `mask`
// have arrived, the caller receives lane `src_lane`'s bytes.
void warp_exchange(unsigned mask, const void* in, void* out, size_t size, int src_lane);
// Every lane deposits `size` bytes (<= 64); each receives all 32 lanes' bytes in lane order.
void warp_allgather(unsigned mask, const void* in, size_t size, void* out);
// The tensor-core instruction the kernels use (kvb_mma.cuh), layouts as in the PTX ISA.
void mma_m16n8k16_f16_f32(float* d, const uint32_t* a, const uint32_t* b);
void mma_m16n8k16_bf16_f32(float* d, const uint32_t* a, const uint32_t* b);  // bf16 operands
int lane_id();

struct LaunchCfg {
  const char* name;
  dim3 grid, block;
  size_t dynamic_smem;
  cudaStream_t stream;
};
// Runs body(closure) once per CUDA thread of the grid; errors go to the next cudaGetLastError().
void run_grid(const LaunchCfg& cfg, void (*body)(void*), void* closure);

template <typename... P>
struct Launcher {
  LaunchCfg cfg;
  void (*kernel)(P...);
  template <typename... A>
  void operator()(A&&... args) const {
    using Args = std::tuple<std::decay_t<P>...>;
    struct Closure {
      void (*kernel)(P...);
      Args args;
    } c{kernel, Args(std::forward<A>(args)...)};
    run_grid(
        cfg,
        [](void* p) {
          std::apply(static_cast<Closure*>(p)->kernel, static_cast<Closure*>(p)->args);
        },
        &c);
  }
};

template <typename... P>
Launcher<P...> launch(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      void (*kernel)(P...)) {
  return Launcher<P...>{LaunchCfg{name, grid, block, smem, stream}, kernel};
}

}  // namespace kvb::emu

#define threadIdx (::kvb::emu::g_thread->thread_idx)
#define blockIdx (::kvb::emu::g_thread->block_idx)
#define blockDim (::kvb::emu::g_thread->block_dim)
#define gridDim (::kvb::emu::g_thread->grid_dim)
#define warpSize 32

inline void __syncthreads() { ::kvb::emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::kvb::emu::warp_exchange(mask, nullptr, nullptr, 0, 0);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of a small value");
  const int lane = ::kvb::emu::lane_id();
  const int src = (lane ^ lane_mask) < ((lane / width) + 1) * width ? (lane ^ lane_mask) : lane;
  T out;
  ::kvb::emu::warp_exchange(mask, &v, &out, sizeof(T), src);
  return out;
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of a small value");
  const int lane = ::kvb::emu::lane_id();
  T out;
  ::kvb::emu::warp_exchange(mask, &v, &out, sizeof(T), (lane / width) * width + src_lane % width);
  return out;
}

template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of a small value");
  const int lane = ::kvb::emu::lane_id(), base = (lane / width) * width;
  const int src =
      lane + static_cast<int>(delta) < base + width ? lane + static_cast<int>(delta) : lane;
  T out;
  ::kvb::emu::warp_exchange(mask, &v, &out, sizeof(T), src);
  return out;
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffle of a small value");
  const int lane = ::kvb::emu::lane_id(), base = (lane / width) * width;
  const int src = lane - static_cast<int>(delta) >= base ? lane - static_cast<int>(delta) : lane;
  T out;
  ::kvb::emu::warp_exchange(mask, &v, &out, sizeof(T), src);
  return out;
}
// Warp votes: every lane of the (full) warp contributes its predicate.
inline unsigned __ballot_sync(unsigned mask, int pred) {
  int all[32];
  const int mine = pred != 0;
  ::kvb::emu::warp_allgather(mask, &mine, sizeof mine, all);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) bits |= static_cast<unsigned>(all[l] != 0) << l;
  return bits & mask;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
inline unsigned __activemask() { return 0xffffffffu; }  // full warps only (the scheduler checks)
// Threads interleave only at barriers and shuffles, so read-modify-writes are atomic as they are.
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

// kernel<<<grid, block, smem, stream>>>(args) for the host compiler.
#define KVB_LAUNCH(grid, block, smem, stream, ...) \
  ::kvb::emu::launch(#__VA_ARGS__, grid, block, smem, stream, __VA_ARGS__)

// ---- runtime API (cuda_emu.cpp): one emulated device with the H200's 132 SMs, so split plans come
// out as on the GPU ----
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t err);
const char* cudaGetErrorName(cudaError_t err);
