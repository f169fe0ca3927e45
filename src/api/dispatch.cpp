// The path rule: fused::cuda::choose_path and the device properties it reads.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include "api/dispatch.h"
#include "util/cuda_check.h"
#include "util/device_info.h"
#include "kernels/recompute/recompute.h"
#if defined(FUSED_WITH_SM90)
#include "kernels/sm90/gemm_stats_sm90.h"
#endif

namespace fused::cuda {
namespace {

bool wants_3xtf32(const ForwardProblem& p) { return p.precision == MatmulPrecision::k3xTF32; }

// Each refusal of the sm90 path states its reason once, after what needed the path: a forced
// path ("path 'sm90' was requested but ...") or precision '3xtf32', which only the sm90 kernels
// implement ("precision '3xtf32' runs on the sm90 path only, which ...").
struct Refusal {
  const char* forced;
  const char* for_3xtf32;
};
#define FUSED_SM90_REFUSAL(reason)                                                            \
  Refusal{"path 'sm90' was requested but the sm90 kernel cannot run this problem: " reason, \
          "precision '3xtf32' runs on the sm90 path only, which cannot run this problem: " reason}

Status refuse(const ForwardProblem& p, const Refusal& r) {
  return {StatusCode::kNotSupported, wants_3xtf32(p) ? r.for_3xtf32 : r.forced};
}

// Null buffers are fresh allocations: 256-byte aligned (any CUDA allocator's), dense rows.
bool aligned16_or_fresh(const void* p) { return p == nullptr || util::aligned16(p); }
int64_t stride_or_dense(int64_t ld, int64_t dense) { return ld == 0 ? dense : ld; }

// x's and W's rows as 16-byte copies read them (TMA on sm90, cp.async on the recompute path): K and
// both row strides multiples of 16 bytes.
bool operand_rows_in_16_bytes(const ForwardProblem& p, const ForwardBuffers& b) {
  const int64_t per16 = 16 / static_cast<int64_t>(element_size(p.dtype));
  return p.K % per16 == 0 && stride_or_dense(b.ldx, p.K) % per16 == 0 && stride_or_dense(b.ldw, p.K) % per16 == 0;
}

// Rule 3 at choose_path(): the 128x128 kernels (ping-pong, or split K where the grid fills at most half
// the SMs) cover underfilled grids, except where that grid fills at most half the SMs with K >= 8192
// (cuBLASLt stayed faster on the GPU there).
bool sm90_preferred(const ForwardProblem& p, int num_sms) {
#if defined(FUSED_WITH_SM90)
  const int64_t tiles_128x128 = util::ceil_div(p.M, sm90::partials_row_tile(sm90::Sm90Tile::k128x128)) *
                                util::ceil_div(p.N, sm90::kCtaTileN);
  return !(2 * tiles_128x128 <= num_sms && p.K >= 8192);
#else
  (void)p, (void)num_sms;
  return false;
#endif
}

Status request_from_environment(PathRequest* out) {
  const char* env = std::getenv("GEMM_BN_SOFTMAX_PATH");
  *out = PathRequest::kAuto;
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return Status::Ok();
  if (std::strcmp(env, "sm90") == 0) {
    *out = PathRequest::kSm90;
  } else if (std::strcmp(env, "generic") == 0) {
    *out = PathRequest::kGeneric;
  } else if (std::strcmp(env, "recompute") == 0) {
    *out = PathRequest::kRecompute;
  } else {
    return {StatusCode::kInvalidArgument, "GEMM_BN_SOFTMAX_PATH must be 'auto', 'sm90', 'generic' or 'recompute'"};
  }
  return Status::Ok();
}

}  // namespace

bool sm90_compiled() {
#if defined(FUSED_WITH_SM90)
  return true;
#else
  return false;
#endif
}

Status sm90_can_implement(const ForwardProblem& p, const ForwardBuffers& b) {
  if (!sm90_compiled()) return refuse(p, FUSED_SM90_REFUSAL("this build holds no sm90 kernels"));
  if (p.dtype == ElementType::kFloat32 && p.precision == MatmulPrecision::kHighest)
    return refuse(p, FUSED_SM90_REFUSAL("exact fp32 (precision 'highest') runs on the generic path"));
  if (p.M == 0 || p.N == 0 || p.K == 0) return refuse(p, FUSED_SM90_REFUSAL("empty problem"));
  // TMA: 16-byte aligned base addresses and row strides of x and W; y stored with N % 4 == 0.
  if (!operand_rows_in_16_bytes(p, b))
    return refuse(p, FUSED_SM90_REFUSAL("K and the row strides of x and W must be multiples of 16 bytes (TMA)"));
  if (p.N % 4 != 0 || stride_or_dense(b.ldy, p.N) % 4 != 0)
    return refuse(p, FUSED_SM90_REFUSAL("N and y's row stride must be multiples of 4 (TMA store of y)"));
  if (!aligned16_or_fresh(b.x) || !aligned16_or_fresh(b.weight) || !aligned16_or_fresh(b.y))
    return refuse(p, FUSED_SM90_REFUSAL("x, W and y must be 16-byte aligned (TMA)"));
  // The kernels round M and N up to whole tiles (of at most 256) in int.
  if (p.M > 0x7fffffff - 255 || p.N > 0x7fffffff - 255 || p.K > 0x7fffffff)
    return refuse(p, FUSED_SM90_REFUSAL("M and N must be below 2^31 - 256, K must fit in int32"));
  return Status::Ok();
}

Status sm90_device_ok(const DeviceProperties& device, const ForwardProblem& p) {
  if (device.compute_capability_major != 9)
    return refuse(p, FUSED_SM90_REFUSAL("the GPU is not compute capability 9.x (Hopper)"));
  return Status::Ok();
}

Status generic_can_implement(const ForwardProblem& p) {
  if (wants_3xtf32(p))
    return {StatusCode::kNotSupported,
            "precision '3xtf32' runs on the sm90 path only, and path 'generic' was requested (argument or "
            "GEMM_BN_SOFTMAX_PATH); the generic path's fp32 GEMM is exact fp32 (precision 'highest') or TF32"};
  return Status::Ok();
}

Status recompute_can_implement(const ForwardProblem& p, const ForwardBuffers& b, const DeviceProperties& device) {
#define FUSED_REFUSE_RECOMPUTE(reason) \
  return { StatusCode::kNotSupported, "the recompute path cannot run this problem: " reason }
  if (p.keep_y) FUSED_REFUSE_RECOMPUTE("it never writes y, and y is kept (keep_y; a backward reads y)");
  if (device.compute_capability_major < 8)
    FUSED_REFUSE_RECOMPUTE("it needs compute capability 8.0 or newer (mma.sync)");
  const bool sixteen_bit = p.dtype == ElementType::kBFloat16 || p.dtype == ElementType::kFloat16;
  if (!sixteen_bit && !(p.dtype == ElementType::kFloat32 && p.precision == MatmulPrecision::kTF32))
    FUSED_REFUSE_RECOMPUTE("it runs bf16, fp16 and tf32 only");
  if (p.M == 0 || p.N == 0 || p.K == 0) FUSED_REFUSE_RECOMPUTE("empty problem");
  if (p.K > recompute::max_k(p.dtype)) FUSED_REFUSE_RECOMPUTE("K must be at most 128 (bf16, fp16) or 64 (tf32)");
  if (!operand_rows_in_16_bytes(p, b) || !aligned16_or_fresh(b.x) || !aligned16_or_fresh(b.weight))
    FUSED_REFUSE_RECOMPUTE("x and W must be 16-byte aligned, with K and their row strides multiples of 16 bytes");
  if (p.M > 0x7fffffff || p.N > 0x7fffffff || recompute::num_tiles(p.M, p.N) > recompute::kMaxTiles)
    FUSED_REFUSE_RECOMPUTE("M and N must fit in int32, in at most 2^31 - 1 tiles");
#undef FUSED_REFUSE_RECOMPUTE
  return Status::Ok();
}

Status y_given(const ForwardProblem& p, const ForwardBuffers& b, GemmPath path) {
  if (p.keep_y || b.y != nullptr || !forward_needs_y_scratch(p, path)) return Status::Ok();
  return {StatusCode::kInvalidArgument,
          "y is null (keep_y = false) but this forward writes y and reads it back (the sm90 path's three "
          "kernels, or the generic path): pass a y, or run the recompute path"};
}

Status device_properties(int device, DeviceProperties* out) {
  if (device < 0 || device >= util::kMaxCachedDevices)
    return {StatusCode::kInvalidArgument, "device index out of range [0, 64)"};
  // One per-device cache (util/device_info.h) serves this rule and the kernels' launch shapes.
  int major = 0, sms = 0;
  FUSED_RETURN_IF_ERROR(util::compute_capability_major(device, major));
  FUSED_RETURN_IF_ERROR(util::sm_count(device, sms));
  out->compute_capability_major = major;
  out->multiprocessor_count = sms;
  return Status::Ok();
}

Status choose_path(const ForwardProblem& p, const ForwardBuffers& b, const DeviceProperties& device,
                   PathRequest request, GemmPath* path) {
  if (request == PathRequest::kAuto) FUSED_RETURN_IF_ERROR(request_from_environment(&request));
  if (request == PathRequest::kGeneric) {
    FUSED_RETURN_IF_ERROR(generic_can_implement(p));
    *path = GemmPath::kGeneric;
    return Status::Ok();
  }
  if (request == PathRequest::kRecompute) {  // rule 4: only when asked for
    FUSED_RETURN_IF_ERROR(recompute_can_implement(p, b, device));
    *path = GemmPath::kRecompute;
    return Status::Ok();
  }
  Status sm90_ok = sm90_device_ok(device, p);
  if (sm90_ok.ok()) sm90_ok = sm90_can_implement(p, b);
  if (request == PathRequest::kSm90 || wants_3xtf32(p)) {  // rule 0: no other path for 3xTF32
    if (!sm90_ok.ok()) return sm90_ok;
    *path = GemmPath::kSm90;
    return Status::Ok();
  }
  const bool tiny_tf32 =
      p.dtype == ElementType::kFloat32 && p.precision == MatmulPrecision::kTF32 && p.M <= kExactFp32MaxBatch;  // rule 2
  *path = sm90_ok.ok() && !tiny_tf32 && sm90_preferred(p, device.multiprocessor_count) ? GemmPath::kSm90
                                                                                      : GemmPath::kGeneric;
  return Status::Ok();
}

}  // namespace fused::cuda
