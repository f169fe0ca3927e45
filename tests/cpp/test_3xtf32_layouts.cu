// Layout facts the 3xTF32 mainloop (src/kernels/sm90/mainloop_3xtf32.hpp) relies on, checked on the
// host (CuTe's layout algebra; no GPU): its k-loop accumulates each n half of the CTA tile in an
// n64 wgmma accumulator and adds value i of the first half into the tile accumulator's value i, of
// the second half into value i + half. That is right only if, for every thread, value i of the
// tile accumulator and value i of a half accumulator (shifted by the half's n offset) are the same
// output element.
#include <gtest/gtest.h>

#include "kernels/sm90/mainloop_3xtf32.hpp"

namespace {

using namespace cute;

template <class TileShape>
void expect_halves_map_onto_tile_accumulator() {
  constexpr int kWarpGroups = int(size<0>(TileShape{})) / 64;
  using Full = fused::sm90::detail::TiledMmaRs3xTf32<TileShape, kWarpGroups>;
  using HalfShape = fused::sm90::detail::HalfNTileShape3xTf32<TileShape>;
  using Half = fused::sm90::detail::TiledMmaRs3xTf32<HalfShape, kWarpGroups>;
  constexpr int kTileM = int(size<0>(TileShape{})), kTileN = int(size<1>(TileShape{})), kHalfN = kTileN / 2;
  const auto tile = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kTileN>{}));
  const auto half = make_identity_tensor(make_shape(Int<kTileM>{}, Int<kHalfN>{}));
  ASSERT_EQ(int(size(Full{})), int(size(Half{})));
  int checked = 0;
  for (int thread = 0; thread < int(size(Full{})); ++thread) {
    const auto full_coords = Full{}.get_thread_slice(thread).partition_C(tile);
    const auto half_coords = Half{}.get_thread_slice(thread).partition_C(half);
    const int half_values = int(size(half_coords));
    ASSERT_EQ(int(size(full_coords)), 2 * half_values);
    for (int i = 0; i < half_values; ++i) {
      const auto h = half_coords(i);
      const auto lo = full_coords(i);
      const auto hi = full_coords(i + half_values);
      ASSERT_EQ(int(get<0>(lo)), int(get<0>(h))) << "thread " << thread << " value " << i;
      ASSERT_EQ(int(get<1>(lo)), int(get<1>(h))) << "thread " << thread << " value " << i;
      ASSERT_EQ(int(get<0>(hi)), int(get<0>(h))) << "thread " << thread << " value " << i + half_values;
      ASSERT_EQ(int(get<1>(hi)), int(get<1>(h)) + kHalfN) << "thread " << thread << " value " << i + half_values;
      checked += 2;
    }
  }
  EXPECT_EQ(checked, kTileM * kTileN);  // every output element once
}

TEST(Mainloop3xTf32Layouts, HalfAccumulatorsAreTheTileAccumulatorsHalves128x128) {
  expect_halves_map_onto_tile_accumulator<Shape<_128, _128, _32>>();
}

TEST(Mainloop3xTf32Layouts, HalfAccumulatorsAreTheTileAccumulatorsHalves128x256) {
  expect_halves_map_onto_tile_accumulator<Shape<_128, _256, _32>>();
}

}  // namespace
