# Locates the installed PyTorch through its Python package instead of find_package(Torch).
#
# Why: TorchConfig.cmake from a pip-installed CUDA build runs find_package(CUDA/CUDAToolkit)
# and expects the full toolkit (cuBLAS, cuDNN, NVTX ... headers and libraries), while a machine
# may carry only nvcc + cudart, the rest living in the `nvidia-*` wheels. This extension uses
# only torch's own headers and libraries plus cudart (streams, no cuBLAS headers), so it asks
# torch for its include and library folders and its C++ ABI, and links exactly that.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
"import os, torch
from torch.utils import cpp_extension as ce
print(','.join(ce.include_paths()))
print(os.path.join(os.path.dirname(torch.__file__), 'lib'))
print(int(torch.compiled_with_cxx11_abi()))
print(1 if torch.version.cuda else 0)
print(torch.__version__)"
  OUTPUT_VARIABLE _torch_out OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "PyTorch not importable with ${Python3_EXECUTABLE} (pip install torch), "
                      "or configure with -DFUSED_BUILD_TORCH=OFF.\n${_torch_err}")
endif()
string(REPLACE "\n" ";" _torch_lines "${_torch_out}")
list(LENGTH _torch_lines _n)
math(EXPR _first "${_n} - 5")
list(SUBLIST _torch_lines ${_first} 5 _torch_lines)   # ignore warnings torch may print first
list(GET _torch_lines 0 _torch_inc)
string(REPLACE "," ";" _torch_inc "${_torch_inc}")
list(GET _torch_lines 1 TORCH_LIB_DIR)
list(GET _torch_lines 2 _torch_abi)
list(GET _torch_lines 3 FUSED_TORCH_HAS_CUDA)
list(GET _torch_lines 4 FUSED_TORCH_VERSION)
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
