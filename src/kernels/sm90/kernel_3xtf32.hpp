// The 3xTF32 kernels' kernel layer: CUTLASS's cooperative warp-specialized kernel (GemmUniversal with a
// KernelTmaWarpSpecializedCooperative mainloop, the static persistent scheduler), whose types, arguments
// and host side it keeps, with its device body re-stated here (after CUTLASS 4.2's
// sm90_gemm_tma_warpspecialized_cooperative.hpp, BSD-3-Clause) with two changes:
//   - one thread sets up the mainloop's hand-over barriers with the pipelines', before the CTA-wide
//     barrier that orders them all before any use (Mainloop3xTf32::init_ring_barriers);
//   - producer warps 1 and 3, idle in CUTLASS's body with this scheduler, split B's small parts
//     (Mainloop3xTf32::producer_split, K-major B only) for every tile of the CTA, in the scheduler's
//     order, as the consumers take them.
// The split runs inside the producer warpgroup's branch, after its register release: placed after
// CUTLASS's whole body instead (where every role's path joins), the compile spilled registers in the
// consumers' k-loop.
// Cluster shape 1 x 1 only (the 3xTF32 kernels' one): the re-stated body keeps no multicast or cluster
// launch-order logic.
#pragma once

#include "cutlass/arch/grid_dependency_control.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "kernels/sm90/mainloop_3xtf32.hpp"

namespace fused::sm90::detail {

template <class CutlassKernel>
struct Kernel3xTf32 : CutlassKernel {
  using Base = CutlassKernel;
  using typename Base::Params;
  using typename Base::SharedStorage;
  using typename Base::CollectiveMainloop;
  using typename Base::CollectiveEpilogue;
  using typename Base::TileScheduler;
  using typename Base::TileShape;
  using typename Base::ClusterShape;
  using typename Base::TiledMma;
  static_assert(!Base::IsSchedDynamicPersistent && !Base::IsMainloopAuxiliaryLoadNeeded,
                "producer warps 1 and 3 must have no other role");
  static_assert(Base::NumLoadWarpGroups == 1 && Base::NumMMAThreads == 256, "one producer and two consumer warpgroups");
  static_assert(cute::size(ClusterShape{}) == 1, "clusters of one CTA");

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    enum class WarpGroupRole { Producer = 0, Consumer0 = 1, Consumer1 = 2 };
    enum class ProducerWarpRole { Mainloop = 0, Split0 = 1, Epilogue = 2, Split1 = 3 };

    SharedStorage& shared_storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int thread_idx = int(threadIdx.x);
    const int lane_idx = cutlass::canonical_lane_idx();
    const int warp_idx = cutlass::canonical_warp_idx_sync();
    const int warp_group_thread_idx = thread_idx % cutlass::NumThreadsPerWarpGroup;
    const int mma_thread_idx = thread_idx % Base::NumMMAThreads;
    const auto warp_group_role = WarpGroupRole(cutlass::canonical_warp_group_idx());
    const auto producer_warp_role = ProducerWarpRole(warp_idx % cutlass::NumWarpsPerWarpGroup);
    const int lane_predicate = cute::elect_one_sync();

    if (warp_idx == 0 && lane_predicate) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
      CollectiveMainloop::init_ring_barriers(shared_storage.tensors.mainloop);
    }

    CollectiveEpilogue collective_epilogue(params.epilogue, shared_storage.tensors.epilogue);
    const bool is_epi_load_needed = collective_epilogue.is_producer_load_needed();

    // Mainloop load pipeline (its barriers are set up by warp 0 in the constructor).
    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (warp_group_role == WarpGroupRole::Producer && producer_warp_role == ProducerWarpRole::Mainloop)
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1)
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_pipeline_params.is_leader = warp_group_thread_idx == 0;
    mainloop_pipeline_params.num_consumers = Base::NumMMAThreads;
    mainloop_pipeline_params.num_producers = Base::NumProducerThreads;
    mainloop_pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    // Epilogue load pipeline
    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (warp_group_role == WarpGroupRole::Producer && producer_warp_role == ProducerWarpRole::Epilogue)
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1)
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_pipeline_params.dst_blockid = cute::block_rank_in_cluster();
    epi_load_pipeline_params.producer_arv_count = Base::NumEpilogueLoadThreads;
    epi_load_pipeline_params.consumer_arv_count = Base::NumMMAThreads;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes)
      epi_load_pipeline_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    // Epilogue store pipeline
    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename Base::LoadWarpOrderBarrier::Params params_load_order_barrier;
    params_load_order_barrier.group_id = producer_warp_role == ProducerWarpRole::Mainloop ? 0 : 1;
    params_load_order_barrier.group_size = cutlass::NumThreadsPerWarp;
    typename Base::LoadWarpOrderBarrier load_order_barrier(shared_storage.pipelines.load_order, params_load_order_barrier);

    typename CollectiveMainloop::PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    auto mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_load_pipe_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    auto epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    // Every barrier's setup above is visible to all threads past this point.
    __syncthreads();

    auto problem_shape_MNKL = append<4>(params.problem_shape, Int<1>{});
    TiledMma tiled_mma;
    auto blk_shape = TileShape{};
    TileScheduler scheduler{params.scheduler};
    typename TileScheduler::WorkTileInfo work_tile_info;
    CollectiveMainloop collective_mainloop;
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);
    Tensor gB_nkl = get<1>(load_inputs);
    auto tile_coord = [&](auto const& work) {
      auto m_coord = idx2crd(work.M_idx, shape<2>(gA_mkl));
      auto n_coord = idx2crd(work.N_idx, shape<2>(gB_nkl));
      auto l_coord = idx2crd(work.L_idx, shape<4>(gB_nkl));
      return make_coord(m_coord, n_coord, _, l_coord);
    };

    if (warp_group_role == WarpGroupRole::Producer) {
      work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});
      cutlass::arch::warpgroup_reg_dealloc<Base::LoadRegisterRequirement>();

      if (producer_warp_role == ProducerWarpRole::Mainloop) {
        // The prefetched kernel must not touch unflushed global memory before this.
        cutlass::arch::wait_on_dependent_grids();
        bool do_load_order_arrive = true;
        while (work_tile_info.is_valid()) {
          auto blk_coord = tile_coord(work_tile_info);
          auto work_k_tile_count = TileScheduler::get_work_k_tile_count(work_tile_info, problem_shape_MNKL, blk_shape);
          auto work_k_tile_start = TileScheduler::get_work_k_tile_start(work_tile_info);
          auto k_tile_iter = cute::make_coord_iterator(idx2crd(work_k_tile_start, shape<3>(gA_mkl)), shape<3>(gA_mkl));
          collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state, load_inputs,
                                   blk_coord, k_tile_iter, work_k_tile_count, lane_idx, 0u,
                                   shared_storage.tensors.mainloop);
          mainloop_pipe_producer_state.advance(work_k_tile_count);
          if (do_load_order_arrive) {  // the epilogue load warp may begin
            load_order_barrier.arrive();
            do_load_order_arrive = false;
          }
          work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
        }
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
      } else if (producer_warp_role == ProducerWarpRole::Split0 || producer_warp_role == ProducerWarpRole::Split1) {
        if constexpr (CollectiveMainloop::kProducerSplit) {
          const int split_thread =
              (producer_warp_role == ProducerWarpRole::Split0 ? 0 : cutlass::NumThreadsPerWarp) + lane_idx;
          while (work_tile_info.is_valid()) {
            const int k_tile_count = TileScheduler::get_work_k_tile_count(work_tile_info, problem_shape_MNKL, blk_shape);
            collective_mainloop.producer_split(shared_storage.pipelines.mainloop, shared_storage.tensors.mainloop,
                                               k_tile_count, split_thread);
            work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
          }
        }
      } else if (producer_warp_role == ProducerWarpRole::Epilogue && is_epi_load_needed) {
        cutlass::arch::wait_on_dependent_grids();
        if (work_tile_info.is_valid()) load_order_barrier.wait();
        while (work_tile_info.is_valid()) {
          if (TileScheduler::compute_epilogue(work_tile_info, params.scheduler)) {
            epi_load_pipe_producer_state = collective_epilogue.load(
                epi_load_pipeline, epi_load_pipe_producer_state, problem_shape_MNKL, blk_shape,
                tile_coord(work_tile_info), tiled_mma, lane_idx, shared_storage.tensors.epilogue,
                work_tile_info.reduction_subtile_idx());
          }
          work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
        }
        collective_epilogue.load_tail(epi_load_pipeline, epi_load_pipe_producer_state);
      }
    } else if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1) {
      work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});
      cutlass::arch::warpgroup_reg_alloc<Base::MmaRegisterRequirement>();
      bool do_store_tail = false;
      while (work_tile_info.is_valid()) {
        auto blk_coord = tile_coord(work_tile_info);
        auto work_k_tile_count = TileScheduler::get_work_k_tile_count(work_tile_info, problem_shape_MNKL, blk_shape);
        auto accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));  // (MMA,MMA_M,MMA_N)
        collective_mainloop.mma(mainloop_pipeline, mainloop_pipe_consumer_state, accumulators, work_k_tile_count,
                                mma_thread_idx, shared_storage.tensors.mainloop, params.mainloop);
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_pipe_consumer_state, work_k_tile_count);
        mainloop_pipe_consumer_state.advance(work_k_tile_count);
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
        // A hint: the dependent grid may start its prologue (timing only, not correctness).
        if (scheduler.is_last_tile(work_tile_info)) cutlass::arch::launch_dependent_grids();
#endif
        const int consumer_warp_group_idx = cutlass::canonical_warp_group_idx() - Base::NumLoadWarpGroups;
        TileScheduler::fixup(params.scheduler, work_tile_info, accumulators, Base::NumMmaWarpGroups,
                             consumer_warp_group_idx);
        if (TileScheduler::compute_epilogue(work_tile_info, params.scheduler)) {
          auto [epi_load_pipe_consumer_state_next, epi_store_pipe_producer_state_next] = collective_epilogue.store(
              epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
              problem_shape_MNKL, blk_shape, blk_coord, accumulators, tiled_mma, mma_thread_idx,
              shared_storage.tensors.epilogue, work_tile_info.reduction_subtile_idx());
          epi_load_pipe_consumer_state = epi_load_pipe_consumer_state_next;
          epi_store_pipe_producer_state = epi_store_pipe_producer_state_next;
          do_store_tail = true;
        }
        work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
      }
      if (do_store_tail)
        collective_epilogue.store_tail(epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline,
                                       epi_store_pipe_producer_state);
    }
#else
    printf("Kernel3xTf32 needs sm_90a\n");
#endif
  }
};

}  // namespace fused::sm90::detail
