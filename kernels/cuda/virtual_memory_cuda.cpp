// The CUDA twin of the demand-paged KV arena (see virtual_memory_cuda.h): CUDA's virtual memory
// management API reached through cudart's driver entry points.

#include "virtual_memory_cuda.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <mutex>
#include <vector>

namespace kvb::kernels::cuda {
namespace {

// The driver functions this arena calls, looked up once.
struct Driver {
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  std::string error;  // "" when every entry point was found
};

template <typename Fn>
bool lookup(const char* symbol, Fn* fn, std::string* error) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError();
    *error = std::string("CUDA driver entry point ") + symbol + " not available (" +
             cudaGetErrorString(e) + ")";
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string& e = d.error;
    lookup("cuGetErrorString", &d.error_string, &e) &&
        lookup("cuDeviceGetAttribute", &d.device_attribute, &e) &&
        lookup("cuMemGetAllocationGranularity", &d.granularity, &e) &&
        lookup("cuMemAddressReserve", &d.reserve, &e) &&
        lookup("cuMemAddressFree", &d.address_free, &e) && lookup("cuMemCreate", &d.create, &e) &&
        lookup("cuMemRelease", &d.release, &e) && lookup("cuMemMap", &d.map, &e) &&
        lookup("cuMemUnmap", &d.unmap, &e) && lookup("cuMemSetAccess", &d.set_access, &e);
  });
  return d;
}

std::string cu_text(const char* what, CUresult r) {
  const char* s = nullptr;
  if (driver().error_string) driver().error_string(r, &s);
  return std::string(what) + ": " + (s ? s : "CUDA driver error " + std::to_string(r));
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Makes `device`'s primary context current (the VMM calls need an initialised driver).
std::string use_device(int device) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFree(nullptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("CUDA device ") + std::to_string(device) + ": " + cudaGetErrorString(e);
  }
  return "";
}

class CudaVirtualArena final : public VirtualArena {
 public:
  CudaVirtualArena(int device, CUdeviceptr base, size_t bytes, size_t page_bytes)
      : device_(device),
        base_(base),
        bytes_(bytes),
        page_(page_bytes),
        pages_(bytes / page_bytes, 0) {}
  ~CudaVirtualArena() override {
    decommit(0, bytes_);
    driver().address_free(base_, bytes_);
  }

  void* base() const override { return reinterpret_cast<void*>(base_); }
  size_t reserved_bytes() const override { return bytes_; }
  size_t page_bytes() const override { return page_; }
  const char* backend() const override { return "cuda-vmm"; }
  int64_t commit_calls() const override { return calls_; }
  double commit_seconds() const override { return seconds_; }

  std::string commit(size_t offset, size_t bytes) override {
    if (std::string why = check(offset, bytes); !why.empty()) return why;
    const auto t0 = std::chrono::steady_clock::now();
    const Driver& d = driver();
    const CUmemAllocationProp prop = device_prop(device_);
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (size_t off = offset; off < offset + bytes; off += page_) {
      CUmemGenericAllocationHandle& h = pages_[off / page_];
      if (h != 0) continue;
      CUmemGenericAllocationHandle fresh = 0;
      CUresult r = d.create(&fresh, page_, &prop, 0);
      if (r != CUDA_SUCCESS) return cu_text("cuMemCreate", r);
      r = d.map(base_ + off, page_, 0, fresh, 0);
      if (r != CUDA_SUCCESS) {
        d.release(fresh);
        return cu_text("cuMemMap", r);
      }
      r = d.set_access(base_ + off, page_, &access, 1);
      if (r != CUDA_SUCCESS) {
        d.unmap(base_ + off, page_);
        d.release(fresh);
        return cu_text("cuMemSetAccess", r);
      }
      h = fresh;
    }
    account(t0);
    return "";
  }

  std::string decommit(size_t offset, size_t bytes) override {
    if (std::string why = check(offset, bytes); !why.empty()) return why;
    const auto t0 = std::chrono::steady_clock::now();
    const Driver& d = driver();
    std::string first_error;
    // Unmapping needs the pages' pending work done: a kernel may still read them.
    if (resident_bytes(offset, bytes) > 0) cudaDeviceSynchronize();
    for (size_t off = offset; off < offset + bytes; off += page_) {
      CUmemGenericAllocationHandle& h = pages_[off / page_];
      if (h == 0) continue;
      CUresult r = d.unmap(base_ + off, page_);
      if (r == CUDA_SUCCESS) r = d.release(h);
      if (r != CUDA_SUCCESS && first_error.empty()) first_error = cu_text("cuMemUnmap/Release", r);
      h = 0;
    }
    account(t0);
    return first_error;
  }

  int64_t resident_bytes(size_t offset, size_t bytes) const override {
    if (offset > bytes_ || bytes > bytes_ - offset) return -1;
    int64_t n = 0;
    for (size_t p = offset / page_; p < (offset + bytes + page_ - 1) / page_; ++p)
      n += pages_[p] != 0;
    return n * static_cast<int64_t>(page_);
  }
  int64_t huge_resident_bytes() const override { return 0; }

 private:
  std::string check(size_t offset, size_t bytes) const {
    if (offset % page_ != 0 || bytes % page_ != 0)
      return "offset " + std::to_string(offset) + " / size " + std::to_string(bytes) +
             " not a multiple of the " + std::to_string(page_) + "-byte page";
    if (offset > bytes_ || bytes > bytes_ - offset)
      return "range outside the " + std::to_string(bytes_) + "-byte reservation";
    return "";
  }
  void account(std::chrono::steady_clock::time_point t0) {
    ++calls_;
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  int device_;
  CUdeviceptr base_;
  size_t bytes_, page_;
  std::vector<CUmemGenericAllocationHandle> pages_;  // [pages]: the physical handle, 0 = none
  int64_t calls_ = 0;
  double seconds_ = 0;
};

}  // namespace

size_t vmm_granularity_bytes(int device, std::string* error) {
  const Driver& d = driver();
  if (!d.error.empty()) {
    *error = d.error;
    return 0;
  }
  if (std::string why = use_device(device); !why.empty()) {
    *error = why;
    return 0;
  }
  int supported = 0;
  CUresult r = d.device_attribute(&supported,
                                  CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device);
  if (r != CUDA_SUCCESS || !supported) {
    *error = r != CUDA_SUCCESS ? cu_text("cuDeviceGetAttribute", r)
                               : "CUDA device " + std::to_string(device) +
                                     " does not support virtual memory management";
    return 0;
  }
  const CUmemAllocationProp prop = device_prop(device);
  size_t g = 0;
  r = d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) {
    *error = cu_text("cuMemGetAllocationGranularity", r);
    return 0;
  }
  return g;
}

std::unique_ptr<VirtualArena> make_cuda_virtual_arena(int device, size_t bytes, size_t page_bytes,
                                                      std::string* error) {
  const size_t g = vmm_granularity_bytes(device, error);
  if (g == 0) return nullptr;
  if (page_bytes == 0 || page_bytes % g != 0) {
    *error = "page size " + std::to_string(page_bytes) +
             " bytes: CUDA maps physical memory in multiples of the device's granularity (" +
             std::to_string(g) + " bytes); smaller pages need vAttention's patched UVM driver";
    return nullptr;
  }
  bytes = (bytes + page_bytes - 1) / page_bytes * page_bytes;
  CUdeviceptr base = 0;
  const CUresult r = driver().reserve(&base, bytes, page_bytes, 0, 0);
  if (r != CUDA_SUCCESS) {
    *error = cu_text("cuMemAddressReserve", r);
    return nullptr;
  }
  return std::make_unique<CudaVirtualArena>(device, base, bytes, page_bytes);
}

}  // namespace kvb::kernels::cuda
