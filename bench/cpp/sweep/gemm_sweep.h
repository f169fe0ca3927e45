// Registry of the sm90 GEMM + statistics configurations the sweep compares (one TU per variant).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/sm90/gemm_stats_sm90.h"

namespace fused::sweep {

struct SchedulerChoice {
  int raster_order = 0;  // 0 heuristic, 1 along M, 2 along N
  int max_swizzle = 1;
};

struct Variant {
  std::string name;
  bool bf16 = true;  // false: tf32
  int tile_m = 0, tile_n = 0;
  std::function<Status(const sm90::GemmStatsArgs&, void*, cudaStream_t, SchedulerChoice)> run;
  std::function<std::size_t(const sm90::GemmStatsArgs&, SchedulerChoice)> workspace;
};

inline std::vector<Variant>& variants() {
  static std::vector<Variant> v;
  return v;
}

struct Registrar {
  explicit Registrar(Variant v) { variants().push_back(std::move(v)); }
};

}  // namespace fused::sweep
