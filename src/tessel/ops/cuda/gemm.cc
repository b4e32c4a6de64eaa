// cuBLASLt GEMMs (gemm.h): one handle and one workspace per GPU, the algorithm from
// cuBLASLt's heuristic for each call's layouts. libcublasLt is opened on the first GEMM, not
// linked: loading its 540 MB at every start cost each process 0.15 s and 200 MB of memory
// (measured here), and most processes that link the CUDA backend never multiply on a GPU.
#include "tessel/ops/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "tessel/core/cuda/cuda_device.h"
#include "tessel/core/error.h"

namespace tessel::cuda {

namespace {

constexpr size_t kWorkspace = size_t{32} << 20;

// The cuBLASLt entry points used here, resolved from the library at first use.
struct Lt {
#define TESSEL_LT_FUNCTIONS(X)                                                                    \
  X(cublasLtCreate) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescSetAttribute)                 \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutSetAttribute) \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulPreferenceCreate)                                \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulPreferenceDestroy)                      \
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)
#define TESSEL_LT_MEMBER(name) decltype(&::name) name = nullptr;
  TESSEL_LT_FUNCTIONS(TESSEL_LT_MEMBER)
#undef TESSEL_LT_MEMBER
};

const Lt& lt() {
  static const Lt api = [] {
    Lt a;
    void* lib = nullptr;
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"})
      if ((lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    TESSEL_CHECK(lib != nullptr, "cannot load cuBLASLt (libcublasLt.so.13 or .12): {}; is the CUDA toolkit's lib64 "
                 "on LD_LIBRARY_PATH?", ::dlerror());
#define TESSEL_LT_RESOLVE(name)                                                  \
  a.name = reinterpret_cast<decltype(a.name)>(::dlsym(lib, #name));              \
  TESSEL_CHECK(a.name != nullptr, "cuBLASLt has no {}", #name);
    TESSEL_LT_FUNCTIONS(TESSEL_LT_RESOLVE)
#undef TESSEL_LT_RESOLVE
    return a;
  }();
  return api;
}

void check_lt(cublasStatus_t s, const char* what) {
  TESSEL_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLASLt error in {}: status {}", what, static_cast<int>(s));
}

struct PerDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

PerDevice& per_device(Device device) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<PerDevice>> all(64);
  std::lock_guard lock(mutex);
  auto& p = all.at(static_cast<size_t>(device.index));
  if (!p) {
    p = std::make_unique<PerDevice>();
    check_lt(lt().cublasLtCreate(&p->handle), "cublasLtCreate");
    check(cudaMalloc(&p->workspace, kWorkspace), "cudaMalloc (cuBLASLt workspace)");
  }
  return *p;
}

bool tf32() {
  static const bool on = [] {
    const char* v = std::getenv("TESSEL_CUDA_TF32");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// A column-major layout of `rows` x `cols` with leading dim `ld`, batched.
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    check_lt(lt().cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
             "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
      int32_t count = static_cast<int32_t>(batch);
      check_lt(lt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), "batch");
      check_lt(lt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
               "batch stride");
    }
  }
  ~Layout() { lt().cublasLtMatrixLayoutDestroy(l); }
};

}  // namespace

void gemm(Device device, DType dtype, const Gemm& g) {
  if (g.M == 0 || g.N == 0) return;
  activate(device);
  PerDevice& pd = per_device(device);
  cudaDataType_t type = CUDA_R_32F, scale_type = CUDA_R_32F;
  cublasComputeType_t compute = tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (dtype == DType::f64) {
    type = scale_type = CUDA_R_64F;
    compute = CUBLAS_COMPUTE_64F;
  } else if (dtype == DType::bf16) {
    type = CUDA_R_16BF;
    compute = CUBLAS_COMPUTE_32F;
  } else {
    TESSEL_CHECK(dtype == DType::f32, "CUDA gemm: dtype {} (expected f32, f64 or bf16)", dtype_name(dtype));
  }
  cublasLtMatmulDesc_t desc = nullptr;
  check_lt(lt().cublasLtMatmulDescCreate(&desc, compute, scale_type), "cublasLtMatmulDescCreate");
  // Column-major: C^T[N, M] = op(B)^T[N, K] @ op(A)^T[K, M], with B as the first operand.
  cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(lt().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), "transa");
  check_lt(lt().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)), "transb");
  if (g.bias != nullptr) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    check_lt(lt().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue");
    check_lt(lt().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)), "bias");
  }
  // The first operand is B: stored [K, N] row-major = [N, K] column-major (ld N), or [N, K]
  // row-major = [K, N] column-major (ld K) when transposed. Likewise A.
  Layout first(type, g.trans_b ? g.K : g.N, g.trans_b ? g.N : g.K, g.trans_b ? g.K : g.N, g.batch, g.K * g.N);
  Layout second(type, g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, g.trans_a ? g.M : g.K, g.batch, g.M * g.K);
  Layout out(type, g.N, g.M, g.N, g.batch, g.M * g.N);

  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(lt().cublasLtMatmulPreferenceCreate(&pref), "preference");
  size_t ws = kWorkspace;
  check_lt(lt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
           "workspace");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check_lt(lt().cublasLtMatmulAlgoGetHeuristic(pd.handle, desc, first.l, second.l, out.l, out.l, pref, 1, &result, &found),
           "heuristic");
  TESSEL_CHECK(found > 0, "cuBLASLt has no algorithm for a {} GEMM of {}x{}x{}", dtype_name(dtype), g.M, g.N, g.K);
  double one64 = 1.0, beta64 = g.beta;
  float one32 = 1.0f, beta32 = g.beta;
  const void* alpha = dtype == DType::f64 ? static_cast<const void*>(&one64) : &one32;
  const void* beta = dtype == DType::f64 ? static_cast<const void*>(&beta64) : &beta32;
  cublasStatus_t s = lt().cublasLtMatmul(pd.handle, desc, alpha, g.b, first.l, g.a, second.l, beta, g.c, out.l, g.c, out.l,
                                    &result.algo, pd.workspace, kWorkspace, stream_for(device));
  lt().cublasLtMatmulPreferenceDestroy(pref);
  lt().cublasLtMatmulDescDestroy(desc);
  check_lt(s, "cublasLtMatmul");
}

}  // namespace tessel::cuda
