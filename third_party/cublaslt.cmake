# cuBLASLt for the generic path's GEMM (src/kernels/generic/cublaslt_gemm.cpp). Prefers the CUDA
# toolkit's (CUDA::cublasLt); a machine with only nvcc + cudart has it in the `nvidia` Python wheels
# that PyTorch's CUDA build installs (same SONAME, so a process that also loads torch holds one copy).
# Sets FUSED_CUBLASLT_BUILD (what fused_core links in the build tree) and FUSED_CUBLASLT_INSTALL
# (what the installed package's fused_core links).
if(TARGET CUDA::cublasLt)
  set(FUSED_CUBLASLT_BUILD CUDA::cublasLt)
  set(FUSED_CUBLASLT_INSTALL CUDA::cublasLt)  # the package config finds CUDAToolkit
  message(STATUS "cuBLASLt: the CUDA toolkit's")
  return()
endif()

execute_process(
  COMMAND ${Python3_EXECUTABLE} -c "import nvidia; print(';'.join(nvidia.__path__))"
  OUTPUT_VARIABLE _nvidia_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
set(_cublaslt_hints)
foreach(_d IN LISTS _nvidia_dirs)
  list(APPEND _cublaslt_hints "${_d}/cu13" "${_d}/cublas" "${_d}/cu12")
endforeach()
find_path(FUSED_CUBLASLT_INCLUDE_DIR cublasLt.h HINTS ${_cublaslt_hints} PATH_SUFFIXES include)
find_library(FUSED_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
             HINTS ${_cublaslt_hints} PATH_SUFFIXES lib lib64)
if(NOT FUSED_CUBLASLT_INCLUDE_DIR OR NOT FUSED_CUBLASLT_LIBRARY)
  message(FATAL_ERROR "cuBLASLt not found: neither the CUDA toolkit's (CUDA::cublasLt) nor in the nvidia "
                      "wheels (${_nvidia_dirs}). Install the toolkit's cuBLAS or torch's CUDA build (it pulls "
                      "nvidia-cublas), or set FUSED_CUBLASLT_INCLUDE_DIR / FUSED_CUBLASLT_LIBRARY.")
endif()
message(STATUS "cuBLASLt: ${FUSED_CUBLASLT_LIBRARY}")
add_library(fused_cublaslt INTERFACE)
add_library(fused::cublaslt ALIAS fused_cublaslt)
target_include_directories(fused_cublaslt SYSTEM INTERFACE ${FUSED_CUBLASLT_INCLUDE_DIR})
target_link_libraries(fused_cublaslt INTERFACE "${FUSED_CUBLASLT_LIBRARY}")
set(FUSED_CUBLASLT_BUILD fused::cublaslt)
set(FUSED_CUBLASLT_INSTALL "${FUSED_CUBLASLT_LIBRARY}")
