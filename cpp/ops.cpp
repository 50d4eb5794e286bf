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

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "flashattn/params.h"
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
  for (int64_t i = 0; i < 3; ++i) aligned &= t.size(i) == 1 || t.stride(i) % 8 == 0;
  FA_CHECK(aligned, name, " is not 16-byte aligned (a view that starts or steps by a number of "
           "elements that is not a multiple of 8; strides ", t.stride(0), ", ", t.stride(1), ", ",
           t.stride(2), "); pass ", name, ".clone() (flashattn.flash_attn_func copies such inputs "
           "for you)");
}

void check_attn_tensor(const Tensor& t, const char* name, const Tensor& q) {
  check_cuda_tensor(t, name, q);
  FA_CHECK(t.dim() == 4, name, " must be 4-D (batch, seqlen, heads, head_dim), got shape ",
           shape_str(t));
  FA_CHECK(t.scalar_type() == q.scalar_type(), name, " has dtype ", dtype_name(t.scalar_type()),
           " but q has ", dtype_name(q.scalar_type()), "; give q, k and v one dtype");
  FA_CHECK(t.stride(3) == 1, name, " has a non-contiguous last dim (stride ", t.stride(3),
           "); call .contiguous() or pass a tensor whose last dim is contiguous");
  for (int64_t i = 0; i < 4; ++i)
    FA_CHECK(t.size(i) > 0, name, " is empty (shape ", shape_str(t), "); every dim must be >= 1");
  check_aligned(t, name);
}

// What the dispatcher needs of a device, queried once per device and process.
struct DeviceInfo {
  int cc = 0;             // compute capability, 10 * major + minor
  int num_sms = 0;
  int max_smem = 0;       // opt-in shared memory per block, capped by FLASHATTN_MAX_SMEM_KB
  int optin_smem = 0;     // the device's own limit
};

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
    query(&info.optin_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, "shared memory per block");
    info.cc = major * 10 + minor;
    const int cap = smem_cap_bytes();
    info.max_smem = cap > 0 && cap < info.optin_smem ? cap : info.optin_smem;
    infos[device] = info;
    ready[device].store(true, std::memory_order_release);
  }
  return infos[device];
}

int family_for_capability(int cc) {
  FA_CHECK(cc >= 70, "needs compute capability 7.0 or newer; this GPU is ", cc / 10, ".", cc % 10);
  return cc >= 80 ? 80 : (cc >= 75 ? 75 : 70);
}

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

// Checks q/k/v and the options, fills the forward params (pointers to out and
// lse are set by the caller). Returns the kernel family to run.
int prepare_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Options& o,
                FwdParams& p) {
  FA_CHECK(q.is_cuda(), "q is not a CUDA tensor");
  const ScalarType dt = q.scalar_type();
  FA_CHECK(dt == ScalarType::Half || dt == ScalarType::BFloat16, "q has dtype ", dtype_name(dt),
           "; the CUDA kernels take torch.float16 or torch.bfloat16 (cast with .half() or "
           ".bfloat16())");
  check_attn_tensor(q, "q", q);
  check_attn_tensor(k, "k", q);
  check_attn_tensor(v, "v", q);
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2), d = q.size(3);
  const int64_t s_k = k.size(1), h_k = k.size(2);
  FA_CHECK(k.size(0) == b && v.size(0) == b, "batch sizes differ: q ", shape_str(q), ", k ",
           shape_str(k), ", v ", shape_str(v));
  FA_CHECK(k.size(3) == d && v.size(3) == d, "head dims differ: q ", shape_str(q), ", k ",
           shape_str(k), ", v ", shape_str(v), "; q, k and v need one head_dim");
  FA_CHECK(v.size(1) == s_k && v.size(2) == h_k, "k ", shape_str(k), " and v ", shape_str(v),
           " must have the same shape");
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
  FA_CHECK(s_q < (int64_t(1) << 31) && s_k < (int64_t(1) << 31) &&
               b * h * ((s_q + 63) / 64) < (int64_t(1) << 31),
           "the problem is too large for one launch (batch * heads * seqlen_q / 64 >= 2^31)");

  // Features the kernels do not have yet: say which, never compute something else.
  FA_CHECK(o.dropout_p == 0.0, "dropout (dropout_p=", o.dropout_p,
           ") has no CUDA kernel yet; use dropout_p=0 (the CPU reference implements it)");

  const int device = q.get_device_index();
  const DeviceInfo& dev = device_info(device);
  const int cc = dev.cc;
  int family = static_cast<int>(o.family);
  if (family == 0) family = family_for_capability(cc);
  FA_CHECK(family == 70 || family == 75 || family == 80, "unknown kernel family ", family,
           "; use 0 (auto), 70, 75 or 80");
  FA_CHECK(family <= cc, "family sm", family, " cannot run on this GPU (compute capability ",
           cc / 10, ".", cc % 10, ")");
  FA_CHECK(!(family < 80 && dt == ScalarType::BFloat16), "bf16 needs sm_80 tensor cores; the sm",
           family, " family takes fp16 (cast with .half())");

  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
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
  p.device = device;
  return family;
}

// An output (or a tensor shaped like one) `t` that must match `like` in shape and dtype.
void check_like(const Tensor& t, const char* name, const Tensor& like, const char* like_name,
                const Tensor& q) {
  check_cuda_tensor(t, name, q);
  FA_CHECK(t.dim() == 4 && t.size(0) == like.size(0) && t.size(1) == like.size(1) &&
               t.size(2) == like.size(2) && t.size(3) == like.size(3),
           name, " has shape ", shape_str(t), " but ", like_name, " has ", shape_str(like),
           "; they must match");
  FA_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ",
           dtype_name(t.scalar_type()), " but ", like_name, " has ",
           dtype_name(like.scalar_type()));
  FA_CHECK(t.stride(3) == 1, name, " has a non-contiguous last dim; pass a tensor whose last dim "
           "is contiguous");
  check_aligned(t, name);
}

void check_out(const Tensor& out, const Tensor& q) { check_like(out, "out", q, "q", q); }

Tensor run_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               const Options& o) {
  FwdParams p;
  const int family = prepare_fwd(q, k, v, o, p);
  FwdKernelFn fn =
      find_kernel(fwd_kernel_table(), family, q.scalar_type(), q.size(3), device_info(p.device), "forward").fn;
  check_out(out, q);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  Tensor lse = torch::stable::empty({q.size(0), q.size(2), q.size(1)}, ScalarType::Float,
                                    std::nullopt, q.device());
  p.out = out.data_ptr();
  p.out_batch_stride = out.stride(0), p.out_row_stride = out.stride(1),
  p.out_head_stride = out.stride(2);
  p.softmax_lse = static_cast<float*>(lse.data_ptr());
  fn(p, current_stream(q.get_device_index()));
  const cudaError_t err = cudaGetLastError();
  FA_CHECK(err == cudaSuccess, "forward kernel launch failed: ", cudaGetErrorString(err));
  return lse;
}

std::tuple<Tensor, Tensor> fwd(Tensor q, Tensor k, Tensor v, std::optional<Tensor> alibi_slopes,
                               std::optional<Tensor> rng_state, double dropout_p,
                               double softmax_scale, bool causal, int64_t window_left,
                               int64_t window_right, double softcap, int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  FA_CHECK(q.is_cuda(), "q is not a CUDA tensor");
  FA_CHECK(q.dim() == 4, "q must be 4-D (batch, seqlen, heads, head_dim), got shape ",
           shape_str(q));
  Tensor out = torch::stable::empty({q.size(0), q.size(1), q.size(2), q.size(3)},
                                    q.scalar_type(), std::nullopt, q.device());
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

void run_bwd(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
             const Tensor& out, const Tensor& lse_in, const Tensor& dq, const Tensor& dk,
             const Tensor& dv, const Options& o, bool deterministic) {
  BwdParams p;
  const int family = prepare_fwd(q, k, v, o, p);
  check_like(dout, "dout", q, "q", q);
  check_out(out, q);
  check_cuda_tensor(lse_in, "softmax_lse", q);
  FA_CHECK(lse_in.scalar_type() == ScalarType::Float, "softmax_lse has dtype ",
           dtype_name(lse_in.scalar_type()), "; it must be torch.float32 (as fwd returns it)");
  FA_CHECK(lse_in.dim() == 3 && lse_in.size(0) == q.size(0) && lse_in.size(1) == q.size(2) &&
               lse_in.size(2) == q.size(1),
           "softmax_lse has shape ", shape_str(lse_in), "; it must be (batch, heads, seqlen_q) = (",
           q.size(0), ", ", q.size(2), ", ", q.size(1), ")");
  check_like(dq, "dq", q, "q", q);
  check_like(dk, "dk", k, "k", q);
  check_like(dv, "dv", v, "v", q);
  const BwdKernelEntry& kernel =
      find_kernel(bwd_kernel_table(), family, q.scalar_type(), q.size(3), device_info(p.device), "backward");

  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const int64_t b = q.size(0), h = q.size(2), s_q = q.size(1);
  // The lse the forward returned is contiguous; only another one costs a copy.
  const bool lse_contiguous = lse_in.stride(2) == 1 && lse_in.stride(1) == s_q && lse_in.stride(0) == h * s_q;
  const Tensor lse = lse_contiguous ? lse_in : torch::stable::contiguous(lse_in);
  const int64_t s_q_rounded = (s_q + kBwdSeqlenQRounding - 1) / kBwdSeqlenQRounding *
                              kBwdSeqlenQRounding;
  // One fp32 workspace: dq_accum (b, h, s_q_rounded, bucket), softmax_d (b, h,
  // s_q_rounded) and, in deterministic mode, the int32 semaphores.
  const int64_t rows = b * h * s_q_rounded;
  const int64_t semaphores = deterministic ? rows / kBwdSemaphoreRows : 0;
  Tensor workspace = torch::stable::empty({rows * (kernel.head_dim + 1) + semaphores}, ScalarType::Float,
                                          std::nullopt, q.device());
  float* const dq_accum = static_cast<float*>(workspace.data_ptr());
  float* const softmax_d = dq_accum + rows * kernel.head_dim;

  p.out = out.data_ptr();
  p.out_batch_stride = out.stride(0), p.out_row_stride = out.stride(1),
  p.out_head_stride = out.stride(2);
  p.softmax_lse = static_cast<float*>(lse.data_ptr());
  p.dout = dout.data_ptr();
  p.dout_batch_stride = dout.stride(0), p.dout_row_stride = dout.stride(1),
  p.dout_head_stride = dout.stride(2);
  p.dq = dq.data_ptr();
  p.dq_batch_stride = dq.stride(0), p.dq_row_stride = dq.stride(1), p.dq_head_stride = dq.stride(2);
  p.dk = dk.data_ptr();
  p.dk_batch_stride = dk.stride(0), p.dk_row_stride = dk.stride(1), p.dk_head_stride = dk.stride(2);
  p.dv = dv.data_ptr();
  p.dv_batch_stride = dv.stride(0), p.dv_row_stride = dv.stride(1), p.dv_head_stride = dv.stride(2);
  p.dq_accum = dq_accum;
  p.softmax_d = softmax_d;
  p.dq_semaphore = deterministic ? reinterpret_cast<int*>(softmax_d + rows) : nullptr;
  p.seqlen_q_rounded = static_cast<int>(s_q_rounded);
  p.deterministic = deterministic;
  kernel.fn(p, current_stream(q.get_device_index()));
  const cudaError_t err = cudaGetLastError();
  FA_CHECK(err == cudaSuccess, "backward kernel launch failed: ", cudaGetErrorString(err));
}

std::tuple<Tensor, Tensor, Tensor> bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                       Tensor softmax_lse, std::optional<Tensor> alibi_slopes,
                                       std::optional<Tensor> rng_state, double dropout_p,
                                       double softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap, bool deterministic,
                                       int64_t family) {
  const Options o{alibi_slopes, rng_state, dropout_p, softmax_scale, causal,
                  window_left,  window_right, softcap, family};
  FA_CHECK(q.is_cuda(), "q is not a CUDA tensor");
  FA_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "q, k, v must be 4-D (batch, seqlen, heads, head_dim)");
  auto like = [](const Tensor& t) {
    return torch::stable::empty({t.size(0), t.size(1), t.size(2), t.size(3)}, t.scalar_type(),
                                std::nullopt, t.device());
  };
  Tensor dq = like(q), dk = like(k), dv = like(v);
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

}  // namespace
}  // namespace flashattn

STABLE_TORCH_LIBRARY_IMPL(flashattn, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&flashattn::fwd));
  m.impl("fwd_out", TORCH_BOX(&flashattn::fwd_out));
  m.impl("bwd", TORCH_BOX(&flashattn::bwd));
  m.impl("bwd_out", TORCH_BOX(&flashattn::bwd_out));
}
