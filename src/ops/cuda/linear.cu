// Linear layer kernels on CUDA (arguments checked by ops/linear.cc): the three
// products go through cuBLASLt with fp32 accumulation (bf16 operands on the
// tensor cores; f32 operands in exact fp32, not TF32, so f32 runs match the
// CPU to accumulation order), the forward bias fused as the GEMM's epilogue
// where cuBLASLt offers one; the bias gradient is our own deterministic
// column sum.
//
// cuBLASLt is column-major; a row-major [R, C] matrix is its column-major
// transpose [C, R] with leading dimension C, so each row-major product
// Y = A @ B is computed as the column-major Y^T = B^T @ A^T.
//
// cuBLASLt is opened with dlopen at the first GEMM, not linked: loading the
// library runs its static initialisers (half a second and 200 MB of memory
// touched), which every process of a CUDA build would otherwise pay at start,
// on the CPU as much as on the GPU.
#include <cublasLt.h>
#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/shapes.h"

namespace nk::ops::cuda {
namespace {

// The cuBLASLt entry points this file calls, resolved from the library of
// the major version the build's headers name (libcublasLt.so.13 for CUDA 13):
// by the loader's search path first, then in the toolkit folder the build
// found (NK_CUBLASLT_DIR).
#define NK_CUBLASLT_CALLS(X)              \
  X(cublasLtCreate)                       \
  X(cublasLtGetVersion)                   \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmul)

struct Api {
  std::string soname;
#define NK_CUBLASLT_POINTER(name) decltype(&::name) name = nullptr;
  NK_CUBLASLT_CALLS(NK_CUBLASLT_POINTER)
#undef NK_CUBLASLT_POINTER
};

const Api& api() {
  static const Api a = [] {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string why = lib ? "" : dlerror();
#ifdef NK_CUBLASLT_DIR
    if (!lib) {
      lib = dlopen((std::string(NK_CUBLASLT_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) why += std::string("; ") + dlerror();
    }
#endif
    NK_CHECK(lib, "linear: cannot open cuBLASLt ({}) for the CUDA backend: {}", soname, why);
    Api r;
    r.soname = soname;
#define NK_CUBLASLT_RESOLVE(name)                                                               \
  r.name = reinterpret_cast<decltype(r.name)>(dlsym(lib, #name));                               \
  NK_CHECK(r.name, "linear: {} has no {} (a cuBLASLt older than the build's headers?)", soname, \
           #name);
    NK_CUBLASLT_CALLS(NK_CUBLASLT_RESOLVE)
#undef NK_CUBLASLT_RESOLVE
    return r;
  }();
  return a;
}

void check_lt(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt error {} ({}) in {} at {}:{}", int(s), api().cublasLtGetStatusString(s), call,
         file, line);
}
#define NK_CUBLAS_CHECK(call) check_lt((call), #call, __FILE__, __LINE__)

// The process's cuBLASLt handle and GEMM workspace (32 MiB, as cuBLAS
// recommends for Hopper).
struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(32) << 20;
};

Lt& lt() {
  static Lt l;
  static std::once_flag once;
  std::call_once(once, [] {
    NK_CUBLAS_CHECK(api().cublasLtCreate(&l.handle));
    l.workspace = nk::cuda::allocate(l.workspace_bytes);
  });
  return l;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    default:
      NK_CHECK(false, "linear: no cuBLASLt type for {}", dtype_name(t));
  }
  return CUDA_R_32F;
}

// One GEMM shape's cuBLASLt descriptors and chosen algorithm, made at its
// first call and kept: the heuristic query costs tens of microseconds of host
// time, paid once per shape instead of per call. The key is everything the
// descriptors hold except the pointers (the bias pointer is set per call).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // false: cuBLASLt has no algorithm for it
};
// The last entry is the bias pointer's alignment (the largest power of two
// up to 256 dividing its address; 0 without a bias): the heuristic sees that
// pointer, so a plan is only reused for a bias aligned the same way.
using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, DType, int64_t, DType, int64_t,
                           DType, int64_t, bool, bool, DType, uintptr_t>;

cublasLtMatrixLayout_t make_layout(DType t, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  NK_CUBLAS_CHECK(
      api().cublasLtMatrixLayoutCreate(&l, cuda_type(t), uint64_t(rows), uint64_t(cols), ld));
  return l;
}

Plan make_plan(const PlanKey& key, const void* bias) {
  const auto [trans_a, trans_b, m, n, k, at, lda, bt, ldb, dt, ldd, accumulate, has_bias, bias_t,
              bias_align] = key;
  Lt& l = lt();
  Plan p;
  NK_CUBLAS_CHECK(api().cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  NK_CUBLAS_CHECK(
      api().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  NK_CUBLAS_CHECK(
      api().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bct = cuda_type(bias_t);
    NK_CUBLAS_CHECK(api().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &epi, sizeof(epi)));
    NK_CUBLAS_CHECK(api().cublasLtMatmulDescSetAttribute(
        p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bct, sizeof(bct)));
    NK_CUBLAS_CHECK(api().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof(bias)));
  }
  // Stored shapes: op(A) is [m, k], so A is stored [k, m] when transposed.
  p.la = make_layout(at, trans_a ? k : m, trans_a ? m : k, lda);
  p.lb = make_layout(bt, trans_b ? n : k, trans_b ? k : n, ldb);
  p.ld = make_layout(dt, m, n, ldd);
  cublasLtMatmulPreference_t pref = nullptr;
  NK_CUBLAS_CHECK(api().cublasLtMatmulPreferenceCreate(&pref));
  NK_CUBLAS_CHECK(
      api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &l.workspace_bytes, sizeof(l.workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hs = api().cublasLtMatmulAlgoGetHeuristic(l.handle, p.desc, p.la, p.lb, p.ld,
                                                                 p.ld, pref, 1, &heur, &found);
  api().cublasLtMatmulPreferenceDestroy(pref);
  p.ok = hs == CUBLAS_STATUS_SUCCESS && found > 0;
  // Without a bias, no algorithm is an error (gemm says which product);
  // with one, any refusal of the epilogue (seen on an H200: "unsupported
  // value" for some shapes with a minimum-alignment preference) falls back
  // to the product plus our bias kernel.
  if (!has_bias && hs != CUBLAS_STATUS_NOT_SUPPORTED) NK_CUBLAS_CHECK(hs);
  p.algo = heur.algo;
  return p;
}

// Column-major D[m, n] = alpha * op(A) @ op(B) + beta * C (C = D), with op
// transposing when the flag is set; A is [m, k] after op, B [k, n]. `bias`
// (a device vector of m in `bias_t`) is added to every column by the
// epilogue when given. Returns false, having done nothing, when cuBLASLt has
// no algorithm for the bias epilogue with these types (the caller adds the
// bias itself).
bool gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, DType at,
          int64_t lda, const void* b, DType bt, int64_t ldb, void* d, DType dt, int64_t ldd,
          float beta, const void* bias = nullptr, DType bias_t = DType::F32) {
  static std::mutex mu;
  static std::map<PlanKey, Plan> plans;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(bias);
  const uintptr_t bias_align = addr ? std::min<uintptr_t>(256, addr & (~addr + 1)) : 0;
  const PlanKey key{trans_a,     trans_b,         m,      n,         k, at, lda, bt, ldb, dt, ldd,
                    beta != 0.f, bias != nullptr, bias_t, bias_align};
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(key, bias)).first;
  const Plan& p = it->second;
  if (!p.ok) {
    if (bias) return false;
    fail("linear: cuBLASLt has no algorithm for a {}x{}x{} product of {} and {} into {}", m, n, k,
         dtype_name(at), dtype_name(bt), dtype_name(dt));
  }
  if (bias)
    NK_CUBLAS_CHECK(api().cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &bias, sizeof(bias)));
  Lt& l = lt();
  const float alpha = 1.f;
  NK_CUBLAS_CHECK(api().cublasLtMatmul(l.handle, p.desc, &alpha, a, p.la, b, p.lb, &beta, d, p.ld,
                                       d, p.ld, &p.algo, l.workspace, l.workspace_bytes,
                                       nk::cuda::stream()));
  return true;
}

// y [N, out] += b [out] broadcast over rows.
template <typename T, typename B>
__global__ void add_bias_kernel(T* y, const B* b, int64_t n, int64_t out) {
  NK_GRID_STRIDE(i, n * out) {
    y[i] = store<T>(load(y[i]) + load(b[i % out]));
  }
}

// Column sums of dy [N, out] in fixed row blocks: partial [blocks, out] <-
// sum over each block's rows in order; then db [out] += the partials summed
// over blocks in order. Deterministic whatever the launch.
constexpr int64_t kRowBlock = 256;

template <typename T>
__global__ void column_partial_kernel(float* partial, const T* dy, int64_t n, int64_t out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= out) return;
  const int64_t r0 = int64_t(blockIdx.y) * kRowBlock, r1 = min(n, r0 + kRowBlock);
  float s = 0.f;
  for (int64_t r = r0; r < r1; ++r) s += load(dy[r * out + c]);
  partial[int64_t(blockIdx.y) * out + c] = s;
}

__global__ void column_finish_kernel(float* db, const float* partial, int64_t blocks, int64_t out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= out) return;
  float s = 0.f;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b * out + c];
  db[c] += s;
}

template <typename T>
void column_sum_accumulate(float* db, const T* dy, int64_t n, int64_t out) {
  const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
  Tensor partial = Tensor::empty({blocks, out}, DType::F32, Device::CUDA);
  const unsigned cols = unsigned((out + kThreads - 1) / kThreads);
  column_partial_kernel<<<dim3(cols, unsigned(blocks)), kThreads, 0, nk::cuda::stream()>>>(
      partial.data<float>(), dy, n, out);
  NK_CUDA_LAUNCHED("column_partial_kernel");
  column_finish_kernel<<<cols, kThreads, 0, nk::cuda::stream()>>>(db, partial.data<float>(), blocks,
                                                                  out);
  NK_CUDA_LAUNCHED("column_finish_kernel");
}

// A row-major [rows, cols] matrix as cuBLASLt's fast kernels want it: both
// dimensions multiples of 8 and rows 16-byte aligned. Where they are not (a
// vocabulary of 50257), the GEMM gets a zero-padded [rows_p, cols_p] copy:
// an input is copied in (its padding zeros, so padded k-terms add nothing);
// an output is computed there and its [rows, cols] part copied back by
// finish() (with beta = 1 its current value is copied in first). Measured
// on an H200, GPT-2's LM head (16384 x 768 x 50257) ran at 86 TFLOP/s with
// the odd dimension, nanoGPT's reason to pad its vocabulary to 50304.
int64_t round8(int64_t v) {
  return (v + 7) / 8 * 8;
}

// Rows are padded too where they are a GEMM dimension (a weight's `out`),
// not where they are the batch (pad_rows false).
class Padded {
 public:
  Padded(void* p, int64_t rows, int64_t cols, DType t, bool copy_in, bool pad_rows)
      : p_(p), rows_(rows), cols_(cols), elem_(dtype_size(t)), ld_(round8(cols)) {
    const int64_t rows_p = pad_rows ? round8(rows) : rows;
    if (rows_p == rows && ld_ == cols && reinterpret_cast<uintptr_t>(p) % 16 == 0) return;
    pad_ = copy_in ? Tensor::zeros({rows_p, ld_}, t, Device::CUDA)
                   : Tensor::empty({rows_p, ld_}, t, Device::CUDA);
    if (copy_in) copy(pad_.raw(), size_t(ld_) * elem_, p_, size_t(cols_) * elem_);
  }
  void* ptr() const { return pad_.defined() ? pad_.raw() : p_; }
  int64_t ld() const { return ld_; }
  void finish() {
    if (pad_.defined()) copy(p_, size_t(cols_) * elem_, pad_.raw(), size_t(ld_) * elem_);
  }

 private:
  void copy(void* dst, size_t dpitch, const void* src, size_t spitch) const {
    if (rows_ == 0 || cols_ == 0) return;
    NK_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, size_t(cols_) * elem_, size_t(rows_),
                                    cudaMemcpyDeviceToDevice, nk::cuda::stream()));
  }
  void* p_;
  int64_t rows_, cols_;
  size_t elem_;
  int64_t ld_;
  Tensor pad_;
};

}  // namespace

// y [N, out] = x [N, in] @ w [out, in]^T + b [out]
// column-major: y^T [out, N] = (w^T stored [in, out])^T @ x^T [in, N]
// (padded: out_p = round8(out) rows of w, in_p = round8(in) columns, zeros.)
void linear_forward(Tensor y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t out = w.dim(0), in = w.dim(1), n = rows_of(x);
  const DType t = x.dtype();
  Padded wp(w.raw(), out, in, t, true, true), xp(x.raw(), n, in, t, true, false);
  Padded yp(y.raw(), n, out, t, false, false);
  const int64_t out_p = round8(out), in_p = round8(in), n_p = n;
  Tensor bias_pad;
  const void* bias = b.defined() ? b.raw() : nullptr;
  if (b.defined() && out_p != out) {
    bias_pad = Tensor::zeros({out_p}, b.dtype(), Device::CUDA);
    nk::cuda::copy_on_device(bias_pad.raw(), b.raw(), b.nbytes());
    bias = bias_pad.raw();
  }
  const bool fused = gemm(true, false, out_p, n_p, in_p, wp.ptr(), t, wp.ld(), xp.ptr(), t, xp.ld(),
                          yp.ptr(), t, yp.ld(), 0.f, bias, b.defined() ? b.dtype() : DType::F32);
  if (!fused)
    gemm(true, false, out_p, n_p, in_p, wp.ptr(), t, wp.ld(), xp.ptr(), t, xp.ld(), yp.ptr(), t,
         yp.ld(), 0.f);
  yp.finish();
  if (fused || !b.defined()) return;
  dispatch_float(t, "linear_forward", [&](auto yt) {
    using T = decltype(yt);
    dispatch_float(b.dtype(), "linear_forward", [&](auto bt) {
      using B = decltype(bt);
      add_bias_kernel<<<blocks_for(n * out), kThreads, 0, nk::cuda::stream()>>>(
          y.data<T>(), b.data<B>(), n, out);
      NK_CUDA_LAUNCHED("add_bias_kernel");
    });
  });
}

void linear_backward(Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x,
                     const Tensor& w) {
  const int64_t out = w.dim(0), in = w.dim(1), n = rows_of(x);
  const DType t = x.dtype();
  if (dx.defined() || dw.defined()) {
    Padded dyp(dy.raw(), n, out, t, true, false);
    const int64_t out_p = dyp.ld(), in_p = round8(in);
    if (dx.defined()) {  // dx [N, in] = dy [N, out] @ w [out, in]; col-major dx^T = w^T @ dy^T
      Padded dxp(dx.raw(), n, in, t, false, false), wp(w.raw(), out, in, t, true, true);
      gemm(false, false, in_p, n, out_p, wp.ptr(), t, wp.ld(), dyp.ptr(), t, dyp.ld(), dxp.ptr(), t,
           dxp.ld(), 0.f);
      dxp.finish();
    }
    if (dw.defined()) {  // dw [out, in] += dy^T @ x; col-major dw^T [in, out] += x^T @ dy [N, out]
      Padded dwp(dw.raw(), out, in, DType::F32, true, true), xp(x.raw(), n, in, t, true, false);
      gemm(false, true, in_p, out_p, n, xp.ptr(), t, xp.ld(), dyp.ptr(), t, dyp.ld(), dwp.ptr(),
           DType::F32, dwp.ld(), 1.f);
      dwp.finish();
    }
  }
  if (db.defined()) {
    dispatch_float(t, "linear_backward", [&](auto tag) {
      using T = decltype(tag);
      column_sum_accumulate(db.data<float>(), dy.data<T>(), n, out);
    });
  }
}

std::string cublaslt_library() {
  const Api& a = api();
  return a.soname + " (version " + std::to_string(a.cublasLtGetVersion()) + ")";
}

}  // namespace nk::ops::cuda
