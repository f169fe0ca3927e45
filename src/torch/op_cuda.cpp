// CUDA kernel of fused::gemm_bn_softmax: picks the path (sm90 GEMM with the statistics
// epilogue, or cuBLAS + the generic column-partials kernel), allocates through the caching
// allocator (CUDA-graph safe) and launches on the current stream, no host synchronisation.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdlib>

#include "op_common.h"

namespace fused::torch_op {
namespace {

// Compute capability major of a device, cached (cudaDeviceGetAttribute does not synchronise).
int capability_major(int device) {
  static std::array<std::atomic<int>, 64> cache{};  // 0 = unknown
  if (device < 0 || device >= static_cast<int>(cache.size())) return 0;
  int major = cache[device].load(std::memory_order_relaxed);
  if (major == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cache[device].store(major, std::memory_order_relaxed);
  }
  return major;
}

// The operands as the kernels read them: unit column stride and a row stride >= K, else a
// contiguous copy (transposed or broadcast views give correct results, never garbage).
at::Tensor as_row_major(const at::Tensor& t) {
  return (t.stride(1) == 1 && t.stride(0) >= t.size(1) && t.size(1) > 0) ? t : t.contiguous();
}

struct Operands {
  at::Tensor x, weight, bias;
};

Operands operands(const OpArgs& a) {
  Operands o{as_row_major(a.x), as_row_major(a.weight), at::Tensor()};
  if (a.bias.has_value() && a.bias->defined()) o.bias = a.bias->contiguous();
  return o;
}

ForwardProblem problem(const OpArgs& a) {
  ForwardProblem p;
  p.M = a.M(); p.N = a.N(); p.K = a.K();
  p.dtype = element_type(a.x.scalar_type());
  p.precision = resolve_precision(a);
  return p;
}

ForwardBuffers buffers(const Operands& o, const Outputs& outs) {
  const auto& [out, save_mean, save_invstd, y] = outs;
  ForwardBuffers b;
  b.x = o.x.data_ptr(); b.ldx = std::max<int64_t>(o.x.stride(0), o.x.size(1));
  b.weight = o.weight.data_ptr(); b.ldw = std::max<int64_t>(o.weight.stride(0), o.weight.size(1));
  b.bias = o.bias.defined() ? o.bias.data_ptr() : nullptr;
  b.y = y.data_ptr<float>(); b.ldy = y.size(1);
  b.out = out.data_ptr(); b.ldo = out.size(1);
  b.save_mean = save_mean.data_ptr<float>(); b.save_invstd = save_invstd.data_ptr<float>();
  return b;
}

std::string select(const OpArgs& a, const Operands& o, const Outputs& outs) {
  std::string want = a.path.value_or("auto");
  if (want == "auto") {
    if (const char* env = std::getenv("GEMM_BN_SOFTMAX_PATH"); env != nullptr && *env != '\0') {
      want = env;
      TORCH_CHECK(want == "auto" || want == "sm90" || want == "generic",
                  "GEMM_BN_SOFTMAX_PATH must be 'auto', 'sm90' or 'generic', got '", want, "'");
    }
  }
  if (want == "generic") return want;
  std::string why;
  if (capability_major(a.x.get_device()) != 9) {
    why = "the GPU is not compute capability 9.x (Hopper)";
  } else if (Status s = cuda::sm90_can_implement(problem(a), buffers(o, outs)); !s.ok()) {
    why = s.message;
  }
  if (why.empty()) return "sm90";
  TORCH_CHECK(want != "sm90", "path='sm90' was requested but the sm90 kernel cannot run this problem: ", why);
  return "generic";
}

// cuBLAS follows torch's global TF32 switch; an explicit `precision` overrides it for this call.
class CublasTf32Guard {
 public:
  explicit CublasTf32Guard(bool allow) : previous_(at::globalContext().allowTF32CuBLAS()) {
    if (allow != previous_) at::globalContext().setAllowTF32CuBLAS(allow);
  }
  ~CublasTf32Guard() {
    if (at::globalContext().allowTF32CuBLAS() != previous_) at::globalContext().setAllowTF32CuBLAS(previous_);
  }

 private:
  bool previous_;
};

// y = x W^T + b in fp32 through cuBLAS (the generic path's [1]).
void external_gemm(const OpArgs& a, const Operands& o, at::Tensor& y) {
  if (a.M() == 0 || a.N() == 0) return;
  if (a.x.scalar_type() == at::kFloat) {
    CublasTf32Guard guard(resolve_precision(a) == MatmulPrecision::kTF32);
    if (o.bias.defined()) {
      at::addmm_out(y, o.bias, o.x, o.weight.t());
    } else {
      at::mm_out(y, o.x, o.weight.t());
    }
  } else {
    at::mm_out(y, o.x, o.weight.t(), at::kFloat);  // bf16/fp16 operands, fp32 output
    if (o.bias.defined()) y.add_(o.bias);
  }
}

}  // namespace

std::string select_cuda_path(const OpArgs& a) {
  check_args(a);
  c10::cuda::CUDAGuard guard(a.x.device());
  return select(a, operands(a), allocate_outputs(a));
}

Outputs gemm_bn_softmax_cuda(const OpArgs& a) {
  check_args(a);
  c10::cuda::CUDAGuard guard(a.x.device());
  Outputs outs = allocate_outputs(a);
  const Operands o = operands(a);
  const std::string path = select(a, o, outs);
  const cuda::GemmPath gemm_path = path == "sm90" ? cuda::GemmPath::kSm90 : cuda::GemmPath::kExternal;
  if (gemm_path == cuda::GemmPath::kExternal) external_gemm(a, o, std::get<3>(outs));

  bump_num_batches_tracked(a);
  const BatchNormTensors bnt = prepare_batchnorm(a);
  const ForwardProblem p = problem(a);
  const std::size_t ws_bytes = cuda::workspace_bytes(p, gemm_path);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.x.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.x.get_device()).stream();
  throw_on_error(cuda::forward(p, buffers(o, outs), bnt.args(a), gemm_path, workspace.data_ptr(), ws_bytes, stream),
                 "gemm_bn_softmax (CUDA)");
  bnt.commit(a);
  return outs;
}

}  // namespace fused::torch_op
