// The CUDA side of torch.ops.flashattn: argument checks -> params -> dispatch.
// Only PyTorch's stable ABI is used, so one build loads in every torch from the
// target version on. The schemas are defined in python/flashattn/_ops.py.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flashattn/params.h"
#include "flashattn/launch/bwd_kv_splits.h"
#include "flashattn/launch/kv_cache_launch.h"
#include "flashattn/launch/query_tiles.h"
#include "kernel_table.h"

namespace flashattn {
namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

constexpr int kMaxHeadDim = 256;

#define FA_CHECK(cond, ...) STD_TORCH_CHECK(cond, "flashattn: ", __VA_ARGS__)

const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    default: return "a non-floating dtype";
  }
}

std::string shape_str(const Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + ")";
}

void check_cuda_tensor(const Tensor& t, const char* name, const Tensor& ref) {
  FA_CHECK(t.is_cuda(), name, " is not a CUDA tensor; put q, k, v and every other input on one GPU");
  FA_CHECK(t.get_device_index() == ref.get_device_index(), name, " is on cuda:", t.get_device_index(),
           " but q is on cuda:", ref.get_device_index(), "; put all inputs on one device");
}

// The kernels move 16-byte vectors: the start of every row must be 16-byte
// aligned (true of every tensor torch allocates, and of views that start and
// step on multiples of 8 elements).
void check_aligned(const Tensor& t, const char* name) {
  bool aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  std::string strides;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) {
    aligned &= t.size(i) == 1 || t.stride(i) % 8 == 0;
    strides += (i ? ", " : "") + std::to_string(t.stride(i));
  }
  FA_CHECK(aligned, name, " is not 16-byte aligned (a view that starts or steps by a number of "
           "elements that is not a multiple of 8; strides ", strides, "); pass ", name,
           ".clone() (flashattn's public functions copy such inputs for you)");
}

// q, k, v: (batch, seqlen, heads, head_dim), or for varlen (total, heads, head_dim),
// where total may be 0 (every sequence empty).
void check_attn_tensor(const Tensor& t, const char* name, const Tensor& q, bool varlen) {
  check_cuda_tensor(t, name, q);
  const int64_t rank = varlen ? 3 : 4;
  FA_CHECK(t.dim() == rank, name, varlen ? " must be 3-D (total_tokens, heads, head_dim)"
                                         : " must be 4-D (batch, seqlen, heads, head_dim)",
           ", got shape ", shape_str(t));
  FA_CHECK(t.scalar_type() == q.scalar_type(), name, " has dtype ", dtype_name(t.scalar_type()),
           " but q has ", dtype_name(q.scalar_type()), "; give q, k and v one dtype");
  FA_CHECK(t.stride(rank - 1) == 1, name, " has a non-contiguous last dim (stride ", t.stride(rank - 1),
           "); call .contiguous() or pass a tensor whose last dim is contiguous");
  for (int64_t i = varlen ? 1 : 0; i < rank; ++i)
    FA_CHECK(t.size(i) > 0, name, " is empty (shape ", shape_str(t), "); every dim must be >= 1");
  check_aligned(t, name);
}

// What the dispatcher needs of a device, queried once per device and process.
struct DeviceInfo {
  int cc = 0;             // compute capability, 10 * major + minor
  int num_sms = 0;
  int l2_bytes = 0;
  int max_smem = 0;       // opt-in shared memory per block, capped by FLASHATTN_MAX_SMEM_KB
  int optin_smem = 0;     // the device's own limit
  int default_family = 0; // the newest built family that runs on it (family_for_capability)
};

int family_for_capability(int cc);

constexpr int kMaxDevices = 64;

// FLASHATTN_MAX_SMEM_KB caps the shared memory a launch may use (e.g. 99 runs the
// tiles of cc 8.6/8.9 GPUs on any GPU). Read once, at a device's first call.
int smem_cap_bytes() {
  const char* text = std::getenv("FLASHATTN_MAX_SMEM_KB");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long kb = std::strtol(text, &end, 10);
  FA_CHECK(end != text && *end == '\0' && kb > 0 && kb < (1 << 20),
           "FLASHATTN_MAX_SMEM_KB='", text, "' is not a positive number of KB (e.g. 99); unset it "
           "to use all of the GPU's shared memory");
  return static_cast<int>(kb * 1024);
}

// Queried at a device's first call (under a lock; a failed query throws and is
// retried at the next call), then read without one.
const DeviceInfo& device_info(int device) {
  static DeviceInfo infos[kMaxDevices];
  static std::atomic<bool> ready[kMaxDevices];
  static std::mutex mutex;
  FA_CHECK(device >= 0 && device < kMaxDevices, "CUDA device index ", device, " is out of range (flashattn "
           "serves devices 0..", kMaxDevices - 1, "); make the GPU visible under a smaller index with "
           "CUDA_VISIBLE_DEVICES");
  if (ready[device].load(std::memory_order_acquire)) return infos[device];
  std::lock_guard<std::mutex> lock(mutex);
  if (!ready[device].load(std::memory_order_relaxed)) {
    DeviceInfo info;
    int major = 0, minor = 0;
    auto query = [device](int* value, cudaDeviceAttr attr, const char* what) {
      const cudaError_t err = cudaDeviceGetAttribute(value, attr, device);
      FA_CHECK(err == cudaSuccess, "could not read the ", what, " of CUDA device ", device, ": ",
               cudaGetErrorString(err));
    };
    query(&major, cudaDevAttrComputeCapabilityMajor, "compute capability");
    query(&minor, cudaDevAttrComputeCapabilityMinor, "compute capability");
    query(&info.num_sms, cudaDevAttrMultiProcessorCount, "multiprocessor count");
    query(&info.l2_bytes, cudaDevAttrL2CacheSize, "L2 cache size");
    query(&info.optin_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, "shared memory per block");
    info.cc = major * 10 + minor;
    const int cap = smem_cap_bytes();
    info.max_smem = cap > 0 && cap < info.optin_smem ? cap : info.optin_smem;
    info.default_family = family_for_capability(info.cc);
    infos[device] = info;
    ready[device].store(true, std::memory_order_release);
  }
  return infos[device];
}

bool has_forward_family(int family) {
  for (const auto& e : fwd_kernel_table())
    if (e.family == family) return true;
  return false;
}

// The registry's entry of a family; nullptr for a number that is none.
const FamilyInfo* family_info(int family) {
  for (const auto& f : family_registry())
    if (f.family == family) return &f;
  return nullptr;
}

// "70, 75, 80 or 90", for messages.
std::string family_numbers() {
  std::string out;
  const auto& all = family_registry();
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) out += i + 1 == all.size() ? " or " : ", ";
    out += std::to_string(all[i].family);
  }
  return out;
}

bool family_runs_on(const FamilyInfo& f, int cc) { return f.arch_specific ? cc == f.min_cc : cc >= f.min_cc; }

// The newest family that runs on a GPU of capability cc and whose forward the
// build holds (sm90: sm_90a code, cc 9.0 only); where the build holds none, the
// newest that runs there and is not arch-specific (its kernel lookup then says
// what is missing).
int family_for_capability(int cc) {
  const FamilyInfo* built = nullptr;
  const FamilyInfo* portable = nullptr;
  for (const auto& f : family_registry()) {
    if (!family_runs_on(f, cc)) continue;
    if (has_forward_family(f.family) && (built == nullptr || f.family > built->family)) built = &f;
    if (!f.arch_specific && (portable == nullptr || f.family > portable->family)) portable = &f;
  }
  const FamilyInfo* oldest = &family_registry().front();
  FA_CHECK(built != nullptr || portable != nullptr, "needs compute capability ", oldest->min_cc / 10, ".",
           oldest->min_cc % 10, " or newer; this GPU is ", cc / 10, ".", cc % 10);
  return built != nullptr ? built->family : portable->family;
}

// A family whose forward's outputs (lse, and the dropout mask, whose definition
// it shares) are another family's may run that family's backward (families.json's
// "backward"; today every family has its own).
int backward_family(int family) { return family_info(family)->backward_family; }

// The current stream comes from torch's C shim in libtorch_cuda.so, which
// torch loads RTLD_LOCAL. Looking it up there (instead of linking to it) keeps
// the module loadable under a CPU-only torch, where its CUDA ops never run.
cudaStream_t current_stream(int device) {
  using GetStream = AOTITorchError (*)(int32_t, void**);
  static const GetStream get_stream = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    return lib ? reinterpret_cast<GetStream>(dlsym(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
  }();
  FA_CHECK(get_stream != nullptr, "this torch has no CUDA support (libtorch_cuda.so is not loaded); "
           "install a CUDA build of torch");
  void* stream = nullptr;
  FA_CHECK(get_stream(device, &stream) == AOTI_TORCH_SUCCESS, "could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

// The scalar arguments shared by every op.
struct Options {
  std::optional<Tensor> alibi_slopes;
  std::optional<Tensor> rng_state;
  double dropout_p;
  double softmax_scale;
  bool causal;
  int64_t window_left;
  int64_t window_right;
  double softcap;
  int64_t family;
};

// The kernel of the table for (family, dtype, head dim): the smallest head-dim
// bucket that holds d, and of its tiles the one with the most shared memory
// that fits `max_smem`. `what` names the pass in the errors, whose text is
// built only when they are raised.
template <typename Entry>
const Entry& find_kernel(const std::vector<Entry>& table, int family, ScalarType dt, int64_t d,
                         const DeviceInfo& dev, const char* what) {
  // The answer of the previous call, per thread: a loop of calls asks the same question.
  struct Last {
    int family = -1, max_smem = -1;
    ScalarType dt{};
    int64_t d = -1;
    const Entry* entry = nullptr;
  };
  thread_local Last last;
  if (last.entry != nullptr && last.family == family && last.dt == dt && last.d == d &&
      last.max_smem == dev.max_smem)
    return *last.entry;
  const char* dtype = dt == ScalarType::Half ? "fp16" : "bf16";
  int bucket = 0;
  for (const auto& e : table) {
    if (e.family == family && std::strcmp(e.dtype, dtype) == 0 && e.smem_bytes > 0 && e.head_dim >= d &&
        (bucket == 0 || e.head_dim < bucket))
      bucket = e.head_dim;
  }
  const Entry* found = nullptr;
  int smallest = 0;
  for (const auto& e : table) {
    if (e.family != family || e.head_dim != bucket || e.smem_bytes == 0 || std::strcmp(e.dtype, dtype) != 0)
      continue;
    if (smallest == 0 || e.smem_bytes < smallest) smallest = e.smem_bytes;
    if (e.smem_bytes <= dev.max_smem && (found == nullptr || e.smem_bytes > found->smem_bytes)) found = &e;
  }
  if (found != nullptr) {
    last = Last{family, dev.max_smem, dt, d, found};
    return *found;
  }
  if (bucket == 0) {
    std::string built;
    for (const auto& e : table) {
      if (e.family == family && std::strcmp(e.dtype, dtype) == 0 && e.smem_bytes > 0)
        built += " " + std::to_string(e.head_dim);
    }
    FA_CHECK(false, "this build has no ", what, " kernel for family sm", family, ", ", dtype, ", head dim ",
             d, " (built head-dim buckets for it:", built.empty() ? " none" : built,
             "); rebuild with FLASHATTN_FAMILIES / FLASHATTN_DTYPES / FLASHATTN_HEAD_DIMS covering it");
  }
  const bool capped = dev.max_smem < dev.optin_smem;
  FA_CHECK(false, "the sm", family, " ", what, " kernel for head-dim bucket ", bucket, " needs ",
           smallest / 1024, " KB of shared memory per block, and ",
           capped ? "FLASHATTN_MAX_SMEM_KB allows " : "this GPU allows ", dev.max_smem / 1024,
           " KB; ", capped ? "raise or unset FLASHATTN_MAX_SMEM_KB" : "use a smaller head dim");
  return *found;  // unreachable
}

// (batch, row, head) strides of a 4-D tensor, or (0, row, head) of a varlen 3-D one.
void set_strides(const Tensor& t, index_t& batch, index_t& row, index_t& head) {
  const bool varlen = t.dim() == 3;
  batch = varlen ? 0 : t.stride(0);
  row = t.stride(varlen ? 0 : 1);
  head = t.stride(varlen ? 1 : 2);
}

// A varlen batch: the sequences' boundaries and maxima.
struct Varlen {
  const Tensor& cu_seqlens_q;
  const Tensor& cu_seqlens_k;
  int64_t max_seqlen_q, max_seqlen_k;
};

// cu_seqlens: int32 (batch + 1) on q's device, contiguous. Its values are not
// read (that would wait for the GPU): the host checks what the shapes allow.
void check_cu_seqlens(const Tensor& cu, const char* name, const Tensor& q, int64_t batch) {
  check_cuda_tensor(cu, name, q);
  FA_CHECK(cu.scalar_type() == ScalarType::Int, name, " has dtype ", dtype_name(cu.scalar_type()),
           "; it must be torch.int32 (e.g. F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)))");
  FA_CHECK(cu.dim() == 1 && cu.size(0) >= 2, name, " must be 1-D (batch + 1,) with batch >= 1, got shape ",
           shape_str(cu));
  FA_CHECK(batch < 0 || cu.size(0) == batch + 1, name, " has ", cu.size(0),
           " entries but cu_seqlens_q has ", batch + 1, "; both are (batch + 1,)");
  FA_CHECK(cu.stride(0) == 1, name, " must be contiguous");
}

// An int32 (batch,) tensor of per-sequence values on q's device.
void check_per_sequence(const Tensor& t, const char* name, const Tensor& q, int64_t batch) {
  check_cuda_tensor(t, name, q);
  FA_CHECK(t.scalar_type() == ScalarType::Int, name, " has dtype ", dtype_name(t.scalar_type()),
           "; it must be torch.int32");
  FA_CHECK(t.dim() == 1 && t.size(0) == batch, name, " has shape ", shape_str(t), "; it must be (", batch,
           ",), one value per sequence");
  FA_CHECK(t.stride(0) == 1, name, " must be contiguous");
}

// k/v as a KV cache (flash_attn_with_kvcache, or a varlen forward over pages or
// with seqused_k): their leading dims are the cache's, not q's.
struct CacheArgs {
  const Tensor* seqused_k = nullptr;    // (b,) int32: keys of each sequence (before seqlen_new)
  const Tensor* block_table = nullptr;  // (b, pages) int32: k/v are (num_pages, page_size, h_k, d)
  const Tensor* leftpad = nullptr;      // (b,) int32
  const Tensor* batch_idx = nullptr;    // (b,) int32
  int64_t seqlen_k = -1;                // keys of every sequence without seqused_k; -1: the capacity
  int64_t seqlen_new = 0;               // keys appended after seqused_k
};

// Checks q/k/v and the options, fills the forward params (pointers to out and
// lse are set by the caller). Returns the kernel family to run. `varlen`:
// q (total_q, h, d), k/v (total_k, h_k, d) packed sequences; else 4-D batches.
// `cache`: k/v are a KV cache, (b_cache, capacity, h_k, d) or pages.
int prepare_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Options& o,
                FwdParams& p, const Varlen* varlen = nullptr, const CacheArgs* cache = nullptr) {
  FA_CHECK(q.is_cuda(), "q is not a CUDA tensor");
  const ScalarType dt = q.scalar_type();
  FA_CHECK(dt == ScalarType::Half || dt == ScalarType::BFloat16, "q has dtype ", dtype_name(dt),
           "; the CUDA kernels take torch.float16 or torch.bfloat16 (cast with .half() or "
           ".bfloat16())");
  const bool vl = varlen != nullptr;
  const bool paged = cache != nullptr && cache->block_table != nullptr;
  const bool kv_packed = vl && !paged;  // k/v (total_k, h_k, d); else 4-D
  check_attn_tensor(q, "q", q, vl);
  check_attn_tensor(k, cache ? "k_cache" : "k", q, kv_packed);
  check_attn_tensor(v, cache ? "v_cache" : "v", q, kv_packed);
  const int64_t off = vl ? 1 : 0;  // dims (seqlen, heads, head_dim) start here... minus the batch dim
  const int64_t kv_off = kv_packed ? 1 : 0;
  const int64_t h = q.size(2 - off), d = q.size(3 - off), h_k = k.size(2 - kv_off);
  int64_t b, s_q, s_k;
  if (vl && paged) {
    check_cu_seqlens(varlen->cu_seqlens_q, "cu_seqlens_q", q, -1);
    b = varlen->cu_seqlens_q.size(0) - 1;
    check_cu_seqlens(varlen->cu_seqlens_k, "cu_seqlens_k", q, b);
    s_q = varlen->max_seqlen_q, s_k = varlen->max_seqlen_k;
    const int64_t total_q = q.size(0);
    FA_CHECK(s_q >= 0 && s_k >= 0 && s_q < (int64_t(1) << 31) && s_k < (int64_t(1) << 31),
             "max_seqlen_q = ", s_q, " and max_seqlen_k = ", s_k, " must be in [0, 2^31)");
    FA_CHECK(total_q <= b * s_q, "max_seqlen_q = ", s_q, " is smaller than the longest sequence: ", b,
             " sequences hold ", total_q, " query tokens");
    FA_CHECK(total_q < (int64_t(1) << 31), "total_q = ", total_q, " tokens: at most 2^31 - 1");
    p.total_q = static_cast<int>(total_q);
  } else if (vl) {
    check_cu_seqlens(varlen->cu_seqlens_q, "cu_seqlens_q", q, -1);
    b = varlen->cu_seqlens_q.size(0) - 1;
    check_cu_seqlens(varlen->cu_seqlens_k, "cu_seqlens_k", q, b);
    s_q = varlen->max_seqlen_q, s_k = varlen->max_seqlen_k;
    const int64_t total_q = q.size(0), total_k = k.size(0);
    FA_CHECK(s_q >= 0 && s_k >= 0 && s_q < (int64_t(1) << 31) && s_k < (int64_t(1) << 31),
             "max_seqlen_q = ", s_q, " and max_seqlen_k = ", s_k, " must be in [0, 2^31)");
    // With seqused_k a sequence's rows of k may outnumber the keys it uses.
    const bool rows_are_keys = cache == nullptr || cache->seqused_k == nullptr;
    FA_CHECK(total_q <= b * s_q && (!rows_are_keys || total_k <= b * s_k), "max_seqlen_q = ", s_q,
             " / max_seqlen_k = ", s_k,
             " is smaller than the longest sequence: ", b, " sequences hold ", total_q, " query and ", total_k,
             " key tokens; pass the longest sequence's length (e.g. int(lengths.max()))");
    FA_CHECK(total_q < (int64_t(1) << 31) && total_k < (int64_t(1) << 31), "total_q = ", total_q,
             " / total_k = ", total_k, " tokens: cu_seqlens are int32, so at most 2^31 - 1 tokens");
    FA_CHECK(v.size(0) == total_k, "k ", shape_str(k), " and v ", shape_str(v), " must have the same shape");
    p.total_q = static_cast<int>(total_q);
    p.total_k = static_cast<int>(total_k);
  } else if (cache != nullptr) {
    b = q.size(0), s_q = q.size(1), s_k = k.size(1);
    FA_CHECK(paged || cache->batch_idx != nullptr || k.size(0) >= b, "k_cache ", shape_str(k), " holds ",
             k.size(0), " sequences but q ", shape_str(q), " has ", b,
             "; give every sequence a cache row (or map them with cache_batch_idx)");
  } else {
    b = q.size(0), s_q = q.size(1), s_k = k.size(1);
    FA_CHECK(k.size(0) == b && v.size(0) == b, "batch sizes differ: q ", shape_str(q), ", k ",
             shape_str(k), ", v ", shape_str(v));
    FA_CHECK(v.size(1) == s_k, "k ", shape_str(k), " and v ", shape_str(v), " must have the same shape");
  }
  FA_CHECK(k.size(3 - kv_off) == d && v.size(3 - kv_off) == d, "head dims differ: q ", shape_str(q), ", k ",
           shape_str(k), ", v ", shape_str(v), "; q, k and v need one head_dim");
  FA_CHECK(v.size(2 - kv_off) == h_k, "k ", shape_str(k), " and v ", shape_str(v), " must have the same shape");
  if (cache != nullptr) {
    bool same = true;
    for (int64_t i = 0; i < k.dim(); ++i) same &= k.size(i) == v.size(i);
    FA_CHECK(same, "k_cache ", shape_str(k), " and v_cache ", shape_str(v), " must have the same shape");
    if (paged) {
      const Tensor& table = *cache->block_table;
      check_cuda_tensor(table, "block_table", q);
      FA_CHECK(table.scalar_type() == ScalarType::Int, "block_table has dtype ", dtype_name(table.scalar_type()),
               "; it must be torch.int32");
      FA_CHECK(table.dim() == 2 && table.size(0) == b && table.size(1) >= 1, "block_table has shape ",
               shape_str(table), "; it must be (batch, max_pages_per_sequence) = (", b, ", >= 1)");
      FA_CHECK(table.stride(1) == 1, "block_table must be contiguous in its last dim");
      FA_CHECK(cache->leftpad == nullptr, "cache_leftpad is not supported with a paged KV cache (block_table)");
      FA_CHECK(cache->batch_idx == nullptr, "cache_batch_idx is not supported with a paged KV cache "
               "(block_table): the block table already names each sequence's pages");
      const int64_t capacity = k.size(1) * table.size(1);
      FA_CHECK(capacity < (int64_t(1) << 31), "block_table addresses ", capacity, " keys per sequence; at most 2^31 - 1");
      p.block_table = static_cast<const int*>(table.data_ptr());
      p.block_table_batch_stride = table.stride(0);
      p.page_size = static_cast<int>(k.size(1));
      if (!vl) s_k = capacity;
    }
    if (cache->seqused_k != nullptr) {
      check_per_sequence(*cache->seqused_k, vl ? "seqused_k" : "cache_seqlens", q, b);
      p.seqused_k = static_cast<const int*>(cache->seqused_k->data_ptr());
    }
    if (cache->leftpad != nullptr) {
      check_per_sequence(*cache->leftpad, "cache_leftpad", q, b);
      p.kv_leftpad = static_cast<const int*>(cache->leftpad->data_ptr());
    }
    if (cache->batch_idx != nullptr) {
      check_per_sequence(*cache->batch_idx, "cache_batch_idx", q, b);
      p.kv_batch_idx = static_cast<const int*>(cache->batch_idx->data_ptr());
    }
    if (!vl && cache->seqlen_k >= 0) s_k = cache->seqlen_k;
    p.kv_cache = true;
  }
  FA_CHECK(h % h_k == 0, h, " query heads are not a multiple of ", h_k,
           " key/value heads (GQA/MQA needs h % h_k == 0)");
  FA_CHECK(d <= kMaxHeadDim, "head dim ", d, " is over the maximum of ", kMaxHeadDim);
  FA_CHECK(d % 8 == 0, "head dim ", d,
           " is not a multiple of 8; pad it (flashattn.flash_attn_func does this for you)");
  FA_CHECK(o.window_left >= -1 && o.window_right >= -1, "window_size (", o.window_left, ", ",
           o.window_right, ") is invalid; each side is -1 (unbounded) or >= 0");
  FA_CHECK(o.dropout_p >= 0.0 && o.dropout_p < 1.0, "dropout_p ", o.dropout_p,
           " is outside [0, 1)");
  FA_CHECK(o.softcap >= 0.0, "softcap ", o.softcap, " is negative; use 0 to turn it off");
  FA_CHECK(std::isfinite(o.softmax_scale), "softmax_scale ", o.softmax_scale, " is not finite");
  // CTAs of the largest grid (16-row tiles at the least): fixed-length batch *
  // heads * tiles of the longest sequence; varlen heads * (tokens / 16 + batch).
  // (A split-KV grid has at most 128 splits of a query tile and stays below it.)
  const int64_t tiles_per_head = vl ? std::max(q.size(0), kv_packed ? k.size(0) : 0) / 16 + b
                                    : b * ((std::max(s_q, s_k) + 15) / 16);
  FA_CHECK(s_q < (int64_t(1) << 31) && s_k < (int64_t(1) << 31) && tiles_per_head * h < (int64_t(1) << 31),
           "the problem is too large for one launch (heads * tiles of 16 rows >= 2^31); split the batch");

  if (o.dropout_p > 0.0) {
    FA_CHECK(cache == nullptr, "dropout is not supported over a KV cache (an inference forward); use dropout_p=0");
    FA_CHECK(o.rng_state.has_value(), "dropout_p = ", o.dropout_p, " needs rng_state, an int64 tensor [seed, offset] "
             "on q's device or the CPU (flashattn's public functions draw it)");
    const Tensor& r = *o.rng_state;
    if (!r.is_cpu()) check_cuda_tensor(r, "rng_state", q);
    FA_CHECK(r.scalar_type() == ScalarType::Long && r.dim() == 1 && r.size(0) == 2 && r.stride(0) == 1,
             "rng_state must be a contiguous int64 tensor of shape (2,) holding [seed, offset], got ",
             dtype_name(r.scalar_type()), " of shape ", shape_str(r));
    // On q's device the kernels read seed and offset from device memory (a CUDA
    // graph replays with each replay's values); on the CPU (an eager call's draw)
    // their sum is a kernel parameter. An element is kept when its random byte is
    // below a threshold of 1/16 resolution (kernel/dropout.h): 16 t + n = round((1 - p) 4096).
    const long keep16 = std::lround((1.0 - o.dropout_p) * 4096.0);
    p.dropout = true;
    if (r.is_cpu()) {
      const auto* seed_offset = static_cast<const int64_t*>(r.data_ptr());
      p.rng_seed_offset = uint64_t(seed_offset[0]) + uint64_t(seed_offset[1]);
    } else {
      p.rng_state = static_cast<const int64_t*>(r.data_ptr());
    }
    p.dropout_p = static_cast<float>(o.dropout_p);
    p.dropout_threshold = static_cast<uint32_t>(keep16 / 16);
    p.dropout_dither = static_cast<uint32_t>(keep16 % 16);
    for (uint32_t i = 0; i < 8; ++i) {
      const uint32_t b = 2 * i;  // bytes b and b + 1 (their thresholds: t, +1 below the dither)
      p.dropout_thresholds2[i] = (p.dropout_threshold + (b < p.dropout_dither)) |
                                 ((p.dropout_threshold + (b + 1 < p.dropout_dither)) << 16);
    }
    for (uint32_t i = 0; i < 8; ++i) {
      const uint32_t b = 4 * (i / 2) + i % 2;  // bytes b and b + 2 (thresholds up to 256)
      p.dropout_drop_addends[i] = (256 - (p.dropout_threshold + (b < p.dropout_dither))) |
                                  ((256 - (p.dropout_threshold + (b + 2 < p.dropout_dither))) << 16);
    }
    p.dropout_scale = static_cast<float>(1.0 / (1.0 - o.dropout_p));
  }

  const int device = q.get_device_index();
  const DeviceInfo& dev = device_info(device);
  const int cc = dev.cc;
  int family = static_cast<int>(o.family);
  if (family == 0) family = dev.default_family;
  const FamilyInfo* info = family_info(family);
  FA_CHECK(info != nullptr, "unknown kernel family ", family, "; use 0 (auto) or one of ", family_numbers());
  if (!family_runs_on(*info, cc)) {
    const std::string only = info->arch_specific ? std::string("; its sm_") + info->arch_target +
                                                       " code runs on compute capability " +
                                                       std::to_string(info->min_cc / 10) + "." +
                                                       std::to_string(info->min_cc % 10) + " only"
                                                 : std::string();
    FA_CHECK(false, "family sm", family, " cannot run on this GPU (compute capability ", cc / 10, ".", cc % 10, ")",
             only);
  }
  FA_CHECK(!(!info->bf16 && dt == ScalarType::BFloat16), "bf16 needs sm_80 tensor cores; the sm",
           family, " family takes fp16 (cast with .half())");

  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  set_strides(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  set_strides(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  set_strides(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  if (vl) {
    p.cu_seqlens_q = static_cast<const int*>(varlen->cu_seqlens_q.data_ptr());
    p.cu_seqlens_k = static_cast<const int*>(varlen->cu_seqlens_k.data_ptr());
  }
  if (cache != nullptr) p.seqlen_new = static_cast<int>(cache->seqlen_new);
  p.batch = static_cast<int>(b);
  p.heads = static_cast<int>(h);
  p.heads_k = static_cast<int>(h_k);
  p.seqlen_q = static_cast<int>(s_q);
  p.seqlen_k = static_cast<int>(s_k);
  p.head_dim = static_cast<int>(d);
  p.softmax_scale = static_cast<float>(o.softmax_scale);
  // With softcap the kernel caps scaled scores, so they need no further scale.
  p.softcap = static_cast<float>(o.softcap);
  p.softcap_prescale = o.softcap > 0 ? static_cast<float>(o.softmax_scale / o.softcap) : 0.f;
  p.score_scale = o.softcap > 0 ? 1.f : static_cast<float>(o.softmax_scale);
  p.score_scale_log2 = static_cast<float>(p.score_scale * M_LOG2E);
  // softmax_scale = 0 (uniform attention): a masked score times 0 would be NaN in
  // the kernels' exp2(s * scale - max); a scale far below any score's resolution
  // gives exp2(0) = 1 for visible and exp2(-inf) = 0 for masked scores. The lse and
  // the gradients' scale use score_scale / softmax_scale, which stay exactly 0.
  if (p.score_scale_log2 == 0.f) p.score_scale_log2 = 1e-30f;
  if (o.alibi_slopes.has_value()) {
    const Tensor& a = *o.alibi_slopes;
    check_cuda_tensor(a, "alibi_slopes", q);
    FA_CHECK(a.scalar_type() == ScalarType::Float, "alibi_slopes has dtype ",
             dtype_name(a.scalar_type()), "; it must be torch.float32");
    const bool per_head = a.dim() == 1 && a.size(0) == h;
    const bool per_batch_head = a.dim() == 2 && a.size(0) == b && a.size(1) == h;
    FA_CHECK(per_head || per_batch_head, "alibi_slopes has shape ", shape_str(a), "; it must be (",
             h, ",) or (", b, ", ", h, ")");
    FA_CHECK(a.stride(a.dim() - 1) == 1, "alibi_slopes must be contiguous in its last dim");
    FA_CHECK(p.score_scale != 0.f, "ALiBi with softmax_scale = 0 has no kernel (the bias is added "
             "in units of q.k * softmax_scale); use a nonzero softmax_scale");
    p.alibi_slopes = static_cast<const float*>(a.data_ptr());
    p.alibi_batch_stride = per_batch_head ? a.stride(0) : 0;
  }
  // Windows wider than the sequences are unbounded: keeps index math in int.
  int64_t wl = o.window_left, wr = o.causal ? 0 : o.window_right;
  if (wl >= s_k + s_q) wl = -1;
  if (wr >= s_k + s_q) wr = -1;
  p.is_causal = o.causal;
  p.window_left = static_cast<int>(wl);
  p.window_right = static_cast<int>(wr);
  p.is_bf16 = dt == ScalarType::BFloat16;
  p.num_sms = dev.num_sms;
  p.l2_bytes = dev.l2_bytes;
  p.device = device;
  p.max_smem = dev.max_smem;
  return family;
}

// An output (or a tensor shaped like one) `t` that must match `like` in shape and dtype.
void check_like(const Tensor& t, const char* name, const Tensor& like, const char* like_name,
                const Tensor& q) {
  check_cuda_tensor(t, name, q);
  bool same = t.dim() == like.dim();
  for (int64_t i = 0; same && i < t.dim(); ++i) same = t.size(i) == like.size(i);
  FA_CHECK(same, name, " has shape ", shape_str(t), " but ", like_name, " has ", shape_str(like),
           "; they must match");
  FA_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ",
           dtype_name(t.scalar_type()), " but ", like_name, " has ",
           dtype_name(like.scalar_type()));
  FA_CHECK(t.stride(t.dim() - 1) == 1, name, " has a non-contiguous last dim; pass a tensor whose last dim "
           "is contiguous");
  check_aligned(t, name);
}

void check_out(const Tensor& out, const Tensor& q) { check_like(out, "out", q, "q", q); }

int64_t head_dim_of(const Tensor& q) { return q.size(q.dim() - 1); }

// softmax_lse: (b, h, s_q), or (h, total_q) for varlen.
void set_lse(FwdParams& p, const Tensor& lse) {
  p.softmax_lse = static_cast<float*>(lse.data_ptr());
  p.lse_batch_stride = lse.dim() == 3 ? lse.stride(0) : 0;
  p.lse_head_stride = lse.stride(lse.dim() - 2);
}

// A new contiguous tensor of `dtype` on `like`'s device, uninitialised. Through
// the shim's aoti_torch_empty_strided, a direct call of at::empty_strided:
// torch::stable::empty calls the dispatcher by the op's name with boxed arguments,
// which made each of a forward + backward's seven allocations cost about 20 us of
// host time under the profiler (3x SDPA's; H100 machine, torch 2.11). If the
// direct call fails (out of memory), the dispatcher's call raises torch's own error.
// `dense_strides`: the new tensor's strides instead (a dense layout; same rank).
constexpr size_t kMaxDims = 8;
Tensor new_tensor(const Tensor& like, torch::headeronly::IntHeaderOnlyArrayRef sizes, ScalarType dtype,
                  const int64_t* dense_strides = nullptr) {
  int64_t strides[kMaxDims];
  const size_t ndim = sizes.size();
  int32_t device_type = 0, device_index = 0;
  AtenTensorHandle handle = nullptr;
  if (ndim <= kMaxDims) {
    int64_t step = 1;
    for (size_t i = ndim; i-- > 0;) {
      strides[i] = dense_strides != nullptr ? dense_strides[i] : step;
      step *= sizes[i];
    }
    if (aoti_torch_get_device_type(like.get(), &device_type) == AOTI_TORCH_SUCCESS &&
        aoti_torch_get_device_index(like.get(), &device_index) == AOTI_TORCH_SUCCESS &&
        aoti_torch_empty_strided(static_cast<int64_t>(ndim), sizes.data(), strides,
                                 torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype)),
                                 device_type, device_index, &handle) == AOTI_TORCH_SUCCESS)
      return Tensor(handle);
  }
  return torch::stable::empty(sizes, dtype, std::nullopt, like.device());
}

Tensor new_lse(const Tensor& q, const Varlen* varlen) {
  if (varlen != nullptr) return new_tensor(q, {q.size(1), q.size(0)}, ScalarType::Float);
  return new_tensor(q, {q.size(0), q.size(2), q.size(1)}, ScalarType::Float);
}

Tensor new_like(const Tensor& t) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < t.dim(); ++i) sizes.push_back(t.size(i));
  return new_tensor(t, sizes, t.scalar_type());
}

// The gradient of q, k or v: dense, with t's dims in t's order in memory (by
// decreasing stride), as torch.empty_like makes it and flash_attn 2.x returns
// it. A (b, h, s, d)-contiguous q passed as its (b, s, h, d) view (a rotary
// embedding's output, transposed) then gets a gradient autograd need not copy
// into the leaf's strides: contiguous gradients cost three strided copies per
// backward there, a quarter of a d128 forward + backward at 1k tokens (H100).
// Contiguous where the last dim would not be innermost.
Tensor new_grad_like(const Tensor& t) {
  const int64_t ndim = t.dim();
  if (ndim > int64_t(kMaxDims)) return new_like(t);
  int64_t order[kMaxDims], strides[kMaxDims];
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < ndim; ++i) {
    order[i] = i;
    sizes.push_back(t.size(i));
  }
  // Outermost first; ties (size-1 dims) keep their order.
  std::stable_sort(order, order + ndim, [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  if (ndim == 0 || order[ndim - 1] != ndim - 1) return new_like(t);
  int64_t step = 1;
  for (int64_t i = ndim; i-- > 0;) {
    strides[order[i]] = step;
    step *= sizes[order[i]];
  }
  return new_tensor(t, sizes, t.scalar_type(), strides);
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  FA_CHECK(err == cudaSuccess, what, " kernel launch failed: ", cudaGetErrorString(err));
}

// GQA packing (the KV cache kernel, fixed-length batches): the g = h / h_k query
// heads of a KV head become rows of the same tiles (params.h), so that K and V are
// read once per group instead of g times, and a decode step fills g rows of a
// tile, not one. Not with ALiBi, whose slope is per head, not per row.
void pack_gqa(FwdParams& p) {
  if (!p.kv_cache || p.cu_seqlens_q != nullptr || p.heads == p.heads_k || p.alibi_slopes != nullptr) return;
  const int g = p.heads / p.heads_k;
  if (int64_t(p.seqlen_q) * g >= (int64_t(1) << 31)) return;
  p.pack_gqa = g;
  p.seqlen_q *= g;
  p.heads = p.heads_k;
}

// Split-KV: how many CTAs share the key blocks of one query tile. A grid that
// already fills the GPU (about two CTAs per SM) gets no split. Otherwise the
// candidates are the counts up to 128 that shorten the longest share
// (ceil(blocks / s) < ceil(blocks / (s - 1)): a count that does not only adds
// CTAs), and of them the fewest whose last wave of CTAs is at least 85% as full
// as the fullest candidate's: every split costs a partial write and its share of
// the merge.
int choose_num_splits(int64_t tiles, int64_t key_blocks, int num_sms) {
  const double slots = 2.0 * num_sms;
  if (tiles >= 0.8 * slots || key_blocks < 2) return 1;
  const int most = static_cast<int>(std::min<int64_t>(128, key_blocks));
  auto share = [&](int splits) { return (key_blocks + splits - 1) / splits; };
  auto candidate = [&](int splits) { return splits == 1 || share(splits) < share(splits - 1); };
  auto fill = [&](int splits) {
    const double waves = double(tiles) * splits / slots;
    return waves / std::ceil(waves);
  };
  double best = 0.0;
  for (int s = 1; s <= most; ++s) {
    if (candidate(s)) best = std::max(best, fill(s));
  }
  for (int s = 1; s <= most; ++s) {
    if (candidate(s) && fill(s) >= 0.85 * best) return s;
  }
  return 1;
}

// The split count of a forward (`requested` > 0: the caller's, within 1..128 and
// the key blocks), and its fp32 workspace: lse_accum, then out_accum (params.h).
// Varlen batches are not split. Returns the workspace (undefined without splits).
std::optional<Tensor> plan_splits(FwdParams& p, const FwdKernelEntry& kernel, int64_t requested,
                                  const Tensor& q) {
  if (p.cu_seqlens_q != nullptr) return std::nullopt;
  // Splits are counted in units of at least 128 keys, whatever the kernel's key
  // block: a split of fewer keys saves less than its partial write and the merge
  // launch cost (a short forward would run two kernels where one did).
  const int64_t unit = std::max(kernel.kv_block_n, 128);
  const int64_t key_blocks = (int64_t(p.seqlen_k) + unit - 1) / unit;
  const int64_t tiles = int64_t(p.batch) * p.heads * ((p.seqlen_q + kernel.kv_block_m - 1) / kernel.kv_block_m);
  const int splits = requested > 0 ? static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({requested, 128, key_blocks})))
                                   : choose_num_splits(tiles, key_blocks, p.num_sms);
  if (splits <= 1) return std::nullopt;
  const int64_t rows = int64_t(p.batch) * p.heads * p.seqlen_q;
  // out_accum is read and written in 16-byte vectors: it starts at a multiple of 4
  // floats past lse_accum (splits * rows need not be one: b = h = s_q = 1).
  const int64_t lse_floats = (splits * rows + 3) / 4 * 4;
  Tensor accum = new_tensor(q, {lse_floats + splits * rows * p.head_dim}, ScalarType::Float);
  p.num_splits = splits;
  p.lse_accum = static_cast<float*>(accum.data_ptr());
  p.out_accum = p.lse_accum + lse_floats;
  p.kv_cache = true;
  return accum;
}

// Under causal and right-window masks the tiles of a forward weigh differently,
// and so do they where the kernel's warpgroups skip rows past a sequence's end
// (kernel.skipping_block_m) and a sequence ends inside a tile: a family with
// `tile_counter` then runs a persistent grid whose CTAs take the next tile
// (heaviest first) from a counter, zeroed here. (Stepping through the tiles by
// the grid's size, the CTAs given the lighter last tiles ran ahead of the others
// of their sequence and head until K and V had left L2: d64 at 512 tokens read
// them 1.3 times from memory; with the counter +8% there, +6% at 1k, and at
// d128, whose tiles all weigh alike, the counter cost 2-5%.) A varlen batch's
// tiles weigh as its sequences: with a counter its grid is persistent too, where
// it ran a CTA per tile (short sequences paid a CTA's start per tile). Only where
// the tiles can outnumber the SMs, counted at the skipping tile's rows where the
// kernel has one, else at 128 (launch/fwd_sm90.h; a larger tile gets a counter it
// may not need, whose CTAs stop at their first take): else one CTA per tile, and
// no allocation or memset (2-3 us of host time). Returns the counter's memory
// (undefined when none).
std::optional<Tensor> zeroed_tile_counter(FwdParams& p, int family, const FwdKernelEntry& kernel, const Tensor& q,
                                          cudaStream_t stream) {
  constexpr int64_t kTileRows = 128;
  // The 128-row tiles that replace the skipping ones on short sequences skip none.
  const int skipping_rows = !use_short_query_tiles(p) ? kernel.skipping_block_m : 0;
  const bool lighter_last_tile = skipping_rows > 0 && p.seqlen_q % skipping_rows != 0;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const bool uneven = (varlen || p.window_right >= 0 || lighter_last_tile) && !p.kv_cache;
  const int64_t tile_rows = skipping_rows > 0 ? skipping_rows : kTileRows;
  // A varlen grid's tiles: QueryTileScheduler's slots (tile_scheduler.h), at most
  // one per sequence of them spare.
  const int64_t tiles_per_head =
      varlen ? p.total_q / tile_rows + p.batch : int64_t(p.batch) * ((p.seqlen_q + tile_rows - 1) / tile_rows);
  if (!uneven || !family_info(family)->tile_counter || tiles_per_head * p.heads <= p.num_sms) return std::nullopt;
  Tensor counter = new_tensor(q, {1}, ScalarType::Float);
  p.tile_counter = static_cast<int*>(counter.data_ptr());
  const cudaError_t err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream);
  FA_CHECK(err == cudaSuccess, "clearing the forward's tile counter failed: ", cudaGetErrorString(err));
  return counter;
}

// `cache`: a varlen forward over a KV cache (pages, seqused_k); forward only.
Tensor run_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               const Options& o, const Varlen* varlen = nullptr, const CacheArgs* cache = nullptr) {
  FwdParams p;
  const int family = prepare_fwd(q, k, v, o, p, varlen, cache);
  const FwdKernelEntry& kernel = find_kernel(fwd_kernel_table(), family, q.scalar_type(), head_dim_of(q),
                                             device_info(p.device), "forward");
  check_out(out, q);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  Tensor lse = new_lse(q, varlen);
  p.out = out.data_ptr();
  set_strides(out, p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  set_lse(p, lse);
  if (q.size(0) == 0 || p.seqlen_q == 0) return lse;  // varlen, every sequence empty: nothing to compute
  // Few query rows (decode, short prefill): the KV cache kernel, its smaller
  // query tile and GQA packing. Not with dropout, which that kernel lacks.
  const bool dropout = p.dropout;
  if (p.cu_seqlens_q == nullptr && p.seqlen_q <= kernel.kv_block_m && !dropout) p.kv_cache = true;
  pack_gqa(p);
  const std::optional<Tensor> accum = dropout ? std::nullopt : plan_splits(p, kernel, 0, q);
  const cudaStream_t stream = current_stream(q.get_device_index());
  const std::optional<Tensor> counter = zeroed_tile_counter(p, family, kernel, q, stream);
  kernel.fn(p, stream);
  check_launch("forward");
  return lse;
}

void check_rank(const Tensor& q, bool varlen) {
  FA_CHECK(q.is_cuda(), "q is not a CUDA tensor");
  if (varlen) {
    FA_CHECK(q.dim() == 3, "q must be 3-D (total_q, heads, head_dim), got shape ", shape_str(q));
  } else {
    FA_CHECK(q.dim() == 4, "q must be 4-D (batch, seqlen, heads, head_dim), got shape ", shape_str(q));
  }
}

std::tuple<Tensor, Tensor> fwd(Tensor q, Tensor k, Tensor v, std::optional<Tensor> alibi_slopes,
                               std::optional<Tensor> rng_state, double dropout_p,
                               double softmax_scale, bool causal, int64_t window_left,
                               int64_t window_right, double softcap, int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  check_rank(q, false);
  Tensor out = new_like(q);
  Tensor lse = run_fwd(q, k, v, out, o);
  return std::make_tuple(out, lse);
}

Tensor fwd_out(Tensor q, Tensor k, Tensor v, Tensor out, std::optional<Tensor> alibi_slopes,
               std::optional<Tensor> rng_state, double dropout_p, double softmax_scale,
               bool causal, int64_t window_left, int64_t window_right, double softcap,
               int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  return run_fwd(q, k, v, out, o);
}

// A varlen forward over a KV cache: seqused_k (keys per sequence, from
// cu_seqlens_k[b]) and/or block_table (k/v are pages). Forward only.
std::tuple<Tensor, Tensor> varlen_fwd_cache(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                                            std::optional<Tensor> seqused_k, std::optional<Tensor> block_table,
                                            int64_t max_seqlen_q, int64_t max_seqlen_k,
                                            std::optional<Tensor> alibi_slopes, double softmax_scale, bool causal,
                                            int64_t window_left, int64_t window_right, double softcap,
                                            int64_t family) {
  const Options o{alibi_slopes, std::nullopt, 0.0, softmax_scale, causal, window_left, window_right, softcap, family};
  check_rank(q, true);
  const Varlen varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  CacheArgs cache;
  if (seqused_k.has_value()) cache.seqused_k = &*seqused_k;
  if (block_table.has_value()) cache.block_table = &*block_table;
  Tensor out = new_like(q);
  Tensor lse = run_fwd(q, k, v, out, o, &varlen, &cache);
  return std::make_tuple(out, lse);
}

// flash_attn_with_kvcache: the append (and rotary embedding) into the caches in
// place, then attention over the caches, split when that fills the GPU better.
std::tuple<Tensor, Tensor> fwd_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k,
                                       std::optional<Tensor> v, std::optional<Tensor> rotary_cos,
                                       std::optional<Tensor> rotary_sin, std::optional<Tensor> cache_seqlens,
                                       int64_t cache_seqlen, std::optional<Tensor> cache_batch_idx,
                                       std::optional<Tensor> cache_leftpad, std::optional<Tensor> block_table,
                                       std::optional<Tensor> alibi_slopes, double softmax_scale, bool causal,
                                       int64_t window_left, int64_t window_right, double softcap,
                                       bool rotary_interleaved, int64_t num_splits, int64_t family) {
  const Options o{alibi_slopes, std::nullopt, 0.0, softmax_scale, causal, window_left, window_right, softcap, family};
  check_rank(q, false);
  FA_CHECK(k.has_value() == v.has_value(), "pass both k and v (the new keys and values) or neither");
  FA_CHECK(rotary_cos.has_value() == rotary_sin.has_value(), "pass both rotary_cos and rotary_sin or neither");
  FA_CHECK(!rotary_cos.has_value() || k.has_value(), "rotary_cos/rotary_sin rotate the new keys: pass k and v "
           "too (without new keys, rotate q yourself)");
  FA_CHECK(cache_seqlen >= -1, "cache_seqlens = ", cache_seqlen, " is negative");
  const int64_t s_new = k.has_value() ? k->size(1) : 0;
  FA_CHECK(!k.has_value() || cache_seqlens.has_value() || cache_seqlen >= 0,
           "appending k/v needs cache_seqlens (where each sequence's new keys go)");
  CacheArgs cache;
  if (cache_seqlens.has_value()) cache.seqused_k = &*cache_seqlens;
  if (block_table.has_value()) cache.block_table = &*block_table;
  if (cache_leftpad.has_value()) cache.leftpad = &*cache_leftpad;
  if (cache_batch_idx.has_value()) cache.batch_idx = &*cache_batch_idx;
  cache.seqlen_k = cache_seqlen >= 0 ? cache_seqlen + s_new : -1;
  cache.seqlen_new = s_new;
  FwdParams p;
  const int family_run = prepare_fwd(q, k_cache, v_cache, o, p, nullptr, &cache);
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2), d = q.size(3), h_k = k_cache.size(2);
  const int64_t capacity = block_table.has_value() ? k_cache.size(1) * block_table->size(1) : k_cache.size(1);
  FA_CHECK(cache_seqlen < 0 || cache_seqlen + s_new <= capacity, "the cache holds ", capacity,
           " keys per sequence; cache_seqlens = ", cache_seqlen, " plus ", s_new, " new keys do not fit");
  const FwdKernelEntry& kernel = find_kernel(fwd_kernel_table(), family_run, q.scalar_type(), d,
                                             device_info(p.device), "forward");
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const cudaStream_t stream = current_stream(q.get_device_index());

  // The append and the rotary embedding.
  KvAppendParams a;
  std::optional<Tensor> q_rot;
  if (k.has_value()) {
    for (const Tensor* t : {&*k, &*v}) {
      const char* name = t == &*k ? "k" : "v";
      check_attn_tensor(*t, name, q, false);
      FA_CHECK(t->size(0) == b && t->size(1) == s_new && t->size(2) == h_k && t->size(3) == d, name,
               " has shape ", shape_str(*t), "; the new keys/values must be (batch, seqlen_new, heads_k, head_dim) = (",
               b, ", ", s_new, ", ", h_k, ", ", d, ")");
    }
    FA_CHECK(s_new <= capacity, s_new, " new keys do not fit a cache of ", capacity, " keys per sequence");
    a.k_new = k->data_ptr();
    a.v_new = v->data_ptr();
    set_strides(*k, a.k_new_batch_stride, a.k_new_row_stride, a.k_new_head_stride);
    set_strides(*v, a.v_new_batch_stride, a.v_new_row_stride, a.v_new_head_stride);
  }
  if (rotary_cos.has_value()) {
    const Tensor& cos = *rotary_cos;
    const Tensor& sin = *rotary_sin;
    for (const Tensor* t : {&cos, &sin}) {
      const char* name = t == &cos ? "rotary_cos" : "rotary_sin";
      check_cuda_tensor(*t, name, q);
      FA_CHECK(t->scalar_type() == q.scalar_type(), name, " has dtype ", dtype_name(t->scalar_type()),
               " but q has ", dtype_name(q.scalar_type()), "; give them one dtype");
      FA_CHECK(t->dim() == 2, name, " must be 2-D (seqlen_ro, rotary_dim / 2), got shape ", shape_str(*t));
      FA_CHECK(t->stride(1) == 1 && t->stride(0) == t->size(1), name, " must be contiguous");
    }
    FA_CHECK(sin.size(0) == cos.size(0) && sin.size(1) == cos.size(1), "rotary_cos ", shape_str(cos),
             " and rotary_sin ", shape_str(sin), " must have the same shape");
    const int64_t rotary_dim = 2 * cos.size(1);
    FA_CHECK(rotary_dim % 16 == 0 && rotary_dim <= d, "the rotary dim (2 * rotary_cos.shape[1] = ", rotary_dim,
             ") must be a multiple of 16 and at most the head dim ", d);
    FA_CHECK(cos.size(0) >= capacity, "rotary_cos/rotary_sin have ", cos.size(0),
             " positions but the cache holds ", capacity, "; pass one row per cache position");
    a.q_positions_per_row = causal || window_left >= 0 || window_right >= 0;
    // Under a causal or local mask q row i is rotated at cache_seqlens + i. A device
    // tensor cache_seqlens is checked by the public function (one sync, where it
    // can); the kernel leaves rows past the tables unrotated.
    FA_CHECK(!a.q_positions_per_row || cache_seqlen < 0 || cache_seqlen + s_q <= cos.size(0),
             "under a causal or local mask q's rows are rotated at cache_seqlens + row, up to ",
             cache_seqlen + s_q - 1, ", but rotary_cos/rotary_sin have ", cos.size(0),
             " positions; pass a row per position (or fewer query rows)");
    a.rotary_cos = cos.data_ptr();
    a.rotary_sin = sin.data_ptr();
    a.rotary_dim = static_cast<int>(rotary_dim);
    a.rotary_rows = static_cast<int>(std::min<int64_t>(cos.size(0), INT32_MAX));
    a.rotary_interleaved = rotary_interleaved;
    q_rot = new_like(q);
    a.q = q.data_ptr();
    a.q_rot = q_rot->data_ptr();
    set_strides(q, a.q_batch_stride, a.q_row_stride, a.q_head_stride);
  }
  if (k.has_value()) {
    a.k_cache = k_cache.data_ptr();
    a.v_cache = v_cache.data_ptr();
    set_strides(k_cache, a.k_batch_stride, a.k_row_stride, a.k_head_stride);
    set_strides(v_cache, a.v_batch_stride, a.v_row_stride, a.v_head_stride);
    a.cache_seqlens = p.seqused_k;
    a.cache_seqlen = static_cast<int>(std::max<int64_t>(cache_seqlen, 0));
    a.kv_batch_idx = p.kv_batch_idx;
    a.block_table = p.block_table;
    a.block_table_batch_stride = p.block_table_batch_stride;
    a.page_size = p.page_size;
  }
  a.batch = static_cast<int>(b);
  a.seqlen_q = static_cast<int>(s_q);
  a.seqlen_new = static_cast<int>(s_new);
  a.heads = static_cast<int>(h);
  a.heads_k = static_cast<int>(h_k);
  a.head_dim = static_cast<int>(d);
  a.is_bf16 = p.is_bf16;
  if (k.has_value() || q_rot.has_value()) {
    launch_kv_append(a, stream);
    check_launch("KV cache append");
  }
  if (q_rot.has_value()) {
    p.q = q_rot->data_ptr();
    set_strides(*q_rot, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  }

  Tensor out = new_like(q);
  Tensor lse = new_lse(q, nullptr);
  p.out = out.data_ptr();
  set_strides(out, p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  set_lse(p, lse);
  pack_gqa(p);
  FA_CHECK(num_splits >= 0, "num_splits = ", num_splits, " is negative; use 0 (automatic) or a count >= 1");
  const std::optional<Tensor> accum = plan_splits(p, kernel, num_splits, q);
  kernel.fn(p, stream);
  check_launch("forward");
  return std::make_tuple(out, lse);
}

std::tuple<Tensor, Tensor> varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k,
                                      std::optional<Tensor> alibi_slopes, std::optional<Tensor> rng_state,
                                      double dropout_p, double softmax_scale, bool causal, int64_t window_left,
                                      int64_t window_right, double softcap, int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  check_rank(q, true);
  const Varlen varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  Tensor out = new_like(q);
  Tensor lse = run_fwd(q, k, v, out, o, &varlen);
  return std::make_tuple(out, lse);
}

Tensor varlen_fwd_out(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k, Tensor out, std::optional<Tensor> alibi_slopes,
                      std::optional<Tensor> rng_state, double dropout_p, double softmax_scale, bool causal,
                      int64_t window_left, int64_t window_right, double softcap, int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  const Varlen varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  return run_fwd(q, k, v, out, o, &varlen);
}

// How many CTAs per key block share a GQA group's query heads (params.h
// kv_head_splits). Only where the key-block grid is at most one wave and each
// CTA is long (its heaviest: >= 32 query blocks of 64 over the group's heads):
// the CTAs of a one-wave grid run side by side, and the grid takes as long as
// the heaviest. Under a causal or right-window mask the first key blocks see
// every query, so the smallest split that makes more than one wave (the light
// blocks' SMs then take the second half of a heavy one's heads); without one
// every CTA weighs alike, so the largest split that keeps one wave. The host
// then adds the splits' partial dk, dv (sum_kv_splits). Key blocks are
// counted in the sm90 family's tiles (128 keys up to d128, else 64). H100,
// causal 2k tokens, 32 query heads of 128, 8 kv heads, one sequence: the
// backward kernel 349 -> 259 us; at 512 tokens 95 -> 53 us.
int choose_kv_head_splits(const BwdParams& p, int head_dim_bucket) {
  const int group = p.heads / p.heads_k;
  if (group == 1 || p.num_sms <= 0) return 1;
  const int block_n = head_dim_bucket <= 128 ? 128 : 64;
  const int64_t key_blocks = p.cu_seqlens_k != nullptr ? p.total_k / block_n + p.batch
                                                       : int64_t(p.seqlen_k + block_n - 1) / block_n * p.batch;
  const int64_t tiles = key_blocks * p.heads_k;
  if (tiles > p.num_sms || int64_t(group) * ((p.seqlen_q + 63) / 64) < 32) return 1;
  const bool heavy_first = p.window_right >= 0;
  int splits = 1;
  for (int s = 2; s <= group; ++s) {
    if (group % s != 0) continue;
    if (heavy_first) {
      splits = s;
      if (tiles * s > p.num_sms) break;
    } else if (tiles * s <= p.num_sms) {
      splits = s;
    }
  }
  return splits;
}

// dk (dv) = the sum of the kv_head_splits partial gradients of each kv head
// (part: contiguous, a kv head's splits side by side), into grad's strides.
void sum_kv_splits(const Tensor& part, const Tensor& grad, int splits, const BwdParams& p, cudaStream_t stream) {
  KvSplitSumParams s;
  s.part = part.data_ptr();
  s.out = grad.data_ptr();
  const bool packed = grad.dim() == 3;
  s.batch = packed ? 1 : int(grad.size(0));
  s.rows = grad.size(packed ? 0 : 1);
  s.heads_k = int(grad.size(grad.dim() - 2));
  s.splits = splits;
  s.head_dim = int(grad.size(grad.dim() - 1));
  set_strides(grad, s.out_batch_stride, s.out_row_stride, s.out_head_stride);
  s.is_bf16 = p.is_bf16;
  launch_sum_kv_splits(s, stream);
}

void run_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor& out, const Tensor& lse_in, const Tensor& dq, const Tensor& dk,
             const Tensor& dv, const Options& o, bool deterministic, const Varlen* varlen = nullptr) {
  BwdParams p;
  const int family = prepare_fwd(q, k, v, o, p, varlen);
  check_like(dout, "dout", q, "q", q);
  check_out(out, q);
  check_cuda_tensor(lse_in, "softmax_lse", q);
  FA_CHECK(lse_in.scalar_type() == ScalarType::Float, "softmax_lse has dtype ",
           dtype_name(lse_in.scalar_type()), "; it must be torch.float32 (as fwd returns it)");
  const int64_t b = p.batch, h = p.heads, s_q = p.seqlen_q;
  if (varlen != nullptr) {
    const int64_t total_q = q.size(0);
    FA_CHECK(lse_in.dim() == 2 && lse_in.size(0) == h && lse_in.size(1) == total_q, "softmax_lse has shape ",
             shape_str(lse_in), "; it must be (heads, total_q) = (", h, ", ", total_q, "), as varlen_fwd returns it");
  } else {
    FA_CHECK(lse_in.dim() == 3 && lse_in.size(0) == b && lse_in.size(1) == h && lse_in.size(2) == s_q,
             "softmax_lse has shape ", shape_str(lse_in), "; it must be (batch, heads, seqlen_q) = (", b, ", ",
             h, ", ", s_q, ")");
  }
  check_like(dq, "dq", q, "q", q);
  check_like(dk, "dk", k, "k", q);
  check_like(dv, "dv", v, "v", q);
  const BwdKernelEntry& kernel = find_kernel(bwd_kernel_table(), backward_family(family), q.scalar_type(),
                                             head_dim_of(q), device_info(p.device), "backward");

  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const cudaStream_t stream = current_stream(q.get_device_index());
  // The lse the forward returned is contiguous; only another one costs a copy.
  bool lse_contiguous = lse_in.stride(lse_in.dim() - 1) == 1;
  for (int64_t i = lse_in.dim() - 2, step = lse_in.size(lse_in.dim() - 1); i >= 0; step *= lse_in.size(i--))
    lse_contiguous &= lse_in.size(i) == 1 || lse_in.stride(i) == step;
  const Tensor lse = lse_contiguous ? lse_in : torch::stable::contiguous(lse_in);
  const int64_t s_q_rounded = (s_q + kBwdSeqlenQRounding - 1) / kBwdSeqlenQRounding * kBwdSeqlenQRounding;
  // One fp32 workspace: dq_accum (rows, bucket), softmax_d (rows) and, in
  // deterministic mode, the int32 semaphores (rows / 16, zeroed here). Rows:
  // (b, h, s_q_rounded), or for varlen (h, total_q + b * 128) (params.h).
  const int64_t rows_per_head = varlen != nullptr ? q.size(0) + b * kBwdSeqlenQRounding : b * s_q_rounded;
  const int64_t rows = h * rows_per_head;
  const int64_t semaphores = deterministic ? rows / kBwdSemaphoreRows + 1 : 0;
  Tensor workspace = new_tensor(q, {rows * (kernel.head_dim + 1) + semaphores}, ScalarType::Float);
  float* const dq_accum = static_cast<float*>(workspace.data_ptr());
  float* const softmax_d = dq_accum + rows * kernel.head_dim;

  p.out = out.data_ptr();
  set_strides(out, p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  set_lse(p, lse);
  p.dout = dout.data_ptr();
  set_strides(dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  p.dq = dq.data_ptr();
  set_strides(dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  p.dk = dk.data_ptr();
  set_strides(dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  p.dv = dv.data_ptr();
  set_strides(dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.dq_accum = dq_accum;
  p.softmax_d = softmax_d;
  p.dq_semaphore = deterministic ? reinterpret_cast<int*>(softmax_d + rows) : nullptr;
  p.seqlen_q_rounded = static_cast<int>(s_q_rounded);
  p.ws_batch_stride = varlen != nullptr ? 0 : h * s_q_rounded;
  p.ws_head_stride = varlen != nullptr ? rows_per_head : s_q_rounded;
  p.deterministic = deterministic;
  if (k.size(0) == 0 || p.seqlen_k == 0) {  // varlen, no keys: every query row gives 0
    Tensor dq_zero = dq;
    torch::stable::zero_(dq_zero);
    return;
  }
  if (deterministic) {
    const cudaError_t err = cudaMemsetAsync(p.dq_semaphore, 0, semaphores * sizeof(int), stream);
    FA_CHECK(err == cudaSuccess, "clearing the backward's semaphores failed: ", cudaGetErrorString(err));
  }
  const int splits = choose_kv_head_splits(p, kernel.head_dim);
  std::optional<Tensor> dk_part, dv_part;
  if (splits > 1) {
    auto new_part = [splits](const Tensor& t) {  // t's shape with splits x its heads, contiguous
      std::vector<int64_t> sizes;
      for (int64_t i = 0; i < t.dim(); ++i) sizes.push_back(t.size(i));
      sizes[t.dim() - 2] *= splits;
      return new_tensor(t, sizes, t.scalar_type());
    };
    dk_part = new_part(k);
    dv_part = new_part(v);
    p.dk = dk_part->data_ptr();
    set_strides(*dk_part, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
    p.dv = dv_part->data_ptr();
    set_strides(*dv_part, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
    p.heads_k *= splits;
    p.kv_head_splits = splits;
  }
  kernel.fn(p, stream);
  check_launch("backward");
  if (splits > 1) {
    sum_kv_splits(*dk_part, dk, splits, p, stream);
    sum_kv_splits(*dv_part, dv, splits, p, stream);
    check_launch("backward kv-split sum");
  }
}

std::tuple<Tensor, Tensor, Tensor> bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                       Tensor softmax_lse, std::optional<Tensor> alibi_slopes,
                                       std::optional<Tensor> rng_state, double dropout_p,
                                       double softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap, bool deterministic,
                                       int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  check_rank(q, false);
  FA_CHECK(k.dim() == 4 && v.dim() == 4, "q, k, v must be 4-D (batch, seqlen, heads, head_dim)");
  Tensor dq = new_grad_like(q), dk = new_grad_like(k), dv = new_grad_like(v);
  run_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, o, deterministic);
  return std::make_tuple(dq, dk, dv);
}

void bwd_out(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor dq,
             Tensor dk, Tensor dv, std::optional<Tensor> alibi_slopes,
             std::optional<Tensor> rng_state, double dropout_p, double softmax_scale, bool causal,
             int64_t window_left, int64_t window_right, double softcap, bool deterministic,
             int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  run_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, o, deterministic);
}

// Varlen gradients: dq like q, dk/dv like k/v; a key no query sees (or of a
// sequence with no queries) gets 0. Zeroed first only where the kernels leave
// rows unwritten: when every sequence's keys are empty.
std::tuple<Tensor, Tensor, Tensor> varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                              Tensor softmax_lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k,
                                              std::optional<Tensor> alibi_slopes, std::optional<Tensor> rng_state,
                                              double dropout_p, double softmax_scale, bool causal,
                                              int64_t window_left, int64_t window_right, double softcap,
                                              bool deterministic, int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  check_rank(q, true);
  FA_CHECK(k.dim() == 3 && v.dim() == 3, "k, v must be 3-D (total_k, heads_k, head_dim)");
  const Varlen varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  Tensor dq = new_grad_like(q), dk = new_grad_like(k), dv = new_grad_like(v);
  run_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, o, deterministic, &varlen);
  return std::make_tuple(dq, dk, dv);
}

void varlen_bwd_out(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,
                    Tensor cu_seqlens_q, Tensor cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                    Tensor dq, Tensor dk, Tensor dv, std::optional<Tensor> alibi_slopes,
                    std::optional<Tensor> rng_state, double dropout_p, double softmax_scale, bool causal,
                    int64_t window_left, int64_t window_right, double softcap, bool deterministic,
                    int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  const Varlen varlen{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k};
  run_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, o, deterministic, &varlen);
}

}  // namespace
}  // namespace flashattn

STABLE_TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&flashattn::fwd));
  m.impl("fwd_out", TORCH_BOX(&flashattn::fwd_out));
  m.impl("bwd", TORCH_BOX(&flashattn::bwd));
  m.impl("bwd_out", TORCH_BOX(&flashattn::bwd_out));
  m.impl("varlen_fwd", TORCH_BOX(&flashattn::varlen_fwd));
  m.impl("varlen_fwd_out", TORCH_BOX(&flashattn::varlen_fwd_out));
  m.impl("varlen_bwd", TORCH_BOX(&flashattn::varlen_bwd));
  m.impl("varlen_bwd_out", TORCH_BOX(&flashattn::varlen_bwd_out));
  m.impl("varlen_fwd_cache", TORCH_BOX(&flashattn::varlen_fwd_cache));
  m.impl("fwd_kvcache", TORCH_BOX(&flashattn::fwd_kvcache));
}
