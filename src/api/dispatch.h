// Internal half of the path rule (fused::cuda::choose_path): the checks forward() repeats for a
// path it is handed.
#pragma once

#include "fused/gemm_bn_softmax.h"

namespace fused::cuda {

// Whether the sm90 kernels take this problem and these buffers (build, dtype, precision, TMA's
// operand rules); null buffers count as fresh allocations (see choose_path). kNotSupported + reason.
Status sm90_can_implement(const ForwardProblem& p, const ForwardBuffers& b);
// Whether `device` can run the sm90 kernels (compute capability 9.x); `p` words the refusal.
Status sm90_device_ok(const DeviceProperties& device, const ForwardProblem& p);
// Whether the generic path takes this problem: everything but precision 3xTF32. kNotSupported + reason.
Status generic_can_implement(const ForwardProblem& p);
// Whether the recompute path takes this problem on `device` (keep_y false, small K, cc >= 8.0, 16-byte
// rules for x and W; null buffers count as fresh allocations). kNotSupported + reason.
Status recompute_can_implement(const ForwardProblem& p, const ForwardBuffers& b, const DeviceProperties& device);
// Whether a forward that writes y has a y to write: keep_y, a caller-given y, or a forward that never
// writes y when it is not kept (forward_needs_y_scratch). kInvalidArgument + reason.
Status y_given(const ForwardProblem& p, const ForwardBuffers& b, GemmPath path);

}  // namespace fused::cuda
