# Locates the installed PyTorch through its Python package instead of find_package(Torch).
#
# Why: TorchConfig.cmake from a pip-installed CUDA build runs find_package(CUDA/CUDAToolkit)
# and expects the full toolkit (cuBLAS, cuDNN, NVTX ... headers and libraries), while a machine
# may carry only nvcc + cudart, the rest living in the `nvidia-*` wheels. This extension uses
# torch's own headers and libraries, cudart, and cuBLAS (the generic path's GEMM, on torch's
# per-thread handle), so it asks torch for its include and library folders, its C++ ABI and the
# `nvidia` wheel folders torch loads cuBLAS from, and links exactly that.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
"import os, torch
from torch.utils import cpp_extension as ce
print(','.join(ce.include_paths()))
print(os.path.join(os.path.dirname(torch.__file__), 'lib'))
print(int(torch.compiled_with_cxx11_abi()))
print(1 if torch.version.cuda else 0)
print(torch.__version__)
try:
    import nvidia
    print(','.join(nvidia.__path__) or 'none')
except ImportError:
    print('none')  # a word, not an empty line: the output's trailing whitespace is stripped"
  OUTPUT_VARIABLE _torch_out OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "PyTorch not importable with ${Python3_EXECUTABLE} (pip install torch), "
                      "or configure with -DFUSED_BUILD_TORCH=OFF.\n${_torch_err}")
endif()
string(REPLACE "\n" ";" _torch_lines "${_torch_out}")
list(LENGTH _torch_lines _n)
math(EXPR _first "${_n} - 6")
list(SUBLIST _torch_lines ${_first} 6 _torch_lines)   # ignore warnings torch may print first
list(GET _torch_lines 0 _torch_inc)
string(REPLACE "," ";" _torch_inc "${_torch_inc}")
list(GET _torch_lines 1 TORCH_LIB_DIR)
list(GET _torch_lines 2 _torch_abi)
list(GET _torch_lines 3 FUSED_TORCH_HAS_CUDA)
list(GET _torch_lines 4 FUSED_TORCH_VERSION)
list(GET _torch_lines 5 _torch_nvidia_dirs)
if(_torch_nvidia_dirs STREQUAL "none")  # no `nvidia` wheels (a CPU-only torch)
  set(_torch_nvidia_dirs "")
endif()
string(REPLACE "," ";" _torch_nvidia_dirs "${_torch_nvidia_dirs}")
message(STATUS "PyTorch ${FUSED_TORCH_VERSION} (CUDA build: ${FUSED_TORCH_HAS_CUDA}): ${TORCH_LIB_DIR}")

add_library(fused_torch INTERFACE)
add_library(fused::torch ALIAS fused_torch)
target_include_directories(fused_torch SYSTEM INTERFACE ${_torch_inc})
target_compile_definitions(fused_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_torch_abi})
set(_torch_libs c10 torch_cpu torch)
if(FUSED_TORCH_HAS_CUDA AND FUSED_WITH_CUDA)
  list(APPEND _torch_libs c10_cuda torch_cuda)
endif()
foreach(_l IN LISTS _torch_libs)
  find_library(_torch_lib_${_l} NAMES ${_l} PATHS "${TORCH_LIB_DIR}" NO_DEFAULT_PATH REQUIRED)
  target_link_libraries(fused_torch INTERFACE "${_torch_lib_${_l}}")
endforeach()
# The extension is loaded into a process that already holds torch: resolve against it.
target_link_options(fused_torch INTERFACE "-Wl,-rpath,${TORCH_LIB_DIR}")

# cuBLAS for the CUDA half of the extension: ATen's CUDA headers include cublas_v2.h, and the
# generic path calls cublasGemmEx on torch's handle. Prefer the copy torch itself loads (the
# `nvidia` wheels: same SONAME, so one library in the process), else the CUDA toolkit's.
if(FUSED_TORCH_HAS_CUDA AND FUSED_WITH_CUDA)
  set(_cublas_hints)
  foreach(_d IN LISTS _torch_nvidia_dirs)
    list(APPEND _cublas_hints "${_d}/cu13" "${_d}/cublas" "${_d}/cu12")
  endforeach()
  find_path(FUSED_CUBLAS_INCLUDE_DIR cublas_v2.h
            HINTS ${_cublas_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(FUSED_CUBLAS_LIBRARY NAMES cublas libcublas.so.13 libcublas.so.12
               HINTS ${_cublas_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NOT FUSED_CUBLAS_INCLUDE_DIR OR NOT FUSED_CUBLAS_LIBRARY)
    message(FATAL_ERROR "cuBLAS headers/library not found (looked in the nvidia wheels beside torch: "
                        "${_torch_nvidia_dirs}, and the CUDA toolkit). Install torch's CUDA build "
                        "(it pulls nvidia-cublas) or set FUSED_CUBLAS_INCLUDE_DIR / FUSED_CUBLAS_LIBRARY.")
  endif()
  message(STATUS "cuBLAS: ${FUSED_CUBLAS_LIBRARY}")
  add_library(fused_torch_cuda INTERFACE)
  add_library(fused::torch_cuda ALIAS fused_torch_cuda)
  target_include_directories(fused_torch_cuda SYSTEM INTERFACE ${FUSED_CUBLAS_INCLUDE_DIR})
  target_link_libraries(fused_torch_cuda INTERFACE fused_torch "${FUSED_CUBLAS_LIBRARY}")
endif()
