# Locates the CUTLASS headers shipped inside the pinned `nvidia-cutlass` wheel (its Python
# package `cutlass_library` carries source/include and source/tools/util/include).
# Nothing is copied into this repository and nothing is downloaded. Override with -DCUTLASS_DIR=
# pointing at a CUTLASS source tree (the folder that holds include/cutlass/cutlass.h).
set(FUSED_CUTLASS_VERSION "4.2.0" CACHE STRING "CUTLASS version this project is pinned to")

if(NOT CUTLASS_DIR)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import os, cutlass_library; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
    OUTPUT_VARIABLE _cutlass_src OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE _cutlass_err RESULT_VARIABLE _cutlass_rc)
  if(NOT _cutlass_rc EQUAL 0)
    message(FATAL_ERROR
      "CUTLASS headers not found: `import cutlass_library` failed with ${Python3_EXECUTABLE}.\n"
      "Install the pinned wheel: pip install nvidia-cutlass==4.2.0.0  (or pass -DCUTLASS_DIR=<cutlass tree>,\n"
      "or -DFUSED_SM90=OFF to build without the Hopper kernels).\n${_cutlass_err}")
  endif()
  set(CUTLASS_DIR "${_cutlass_src}")
endif()

set(_cutlass_version_h "${CUTLASS_DIR}/include/cutlass/version.h")
if(NOT EXISTS "${_cutlass_version_h}")
  message(FATAL_ERROR "CUTLASS_DIR=${CUTLASS_DIR} holds no include/cutlass/version.h")
endif()
file(STRINGS "${_cutlass_version_h}" _v REGEX "#define CUTLASS_(MAJOR|MINOR|PATCH) [0-9]+")
string(REGEX REPLACE ".*CUTLASS_MAJOR ([0-9]+).*" "\\1" _maj "${_v}")
string(REGEX REPLACE ".*CUTLASS_MINOR ([0-9]+).*" "\\1" _min "${_v}")
string(REGEX REPLACE ".*CUTLASS_PATCH ([0-9]+).*" "\\1" _pat "${_v}")
set(CUTLASS_VERSION "${_maj}.${_min}.${_pat}")
if(NOT CUTLASS_VERSION VERSION_EQUAL FUSED_CUTLASS_VERSION)
  message(FATAL_ERROR "CUTLASS ${CUTLASS_VERSION} found at ${CUTLASS_DIR}, this project is pinned to "
                      "${FUSED_CUTLASS_VERSION}: pip install nvidia-cutlass==4.2.0.0")
endif()
message(STATUS "CUTLASS ${CUTLASS_VERSION}: ${CUTLASS_DIR}")

add_library(fused_cutlass INTERFACE)
add_library(fused::cutlass ALIAS fused_cutlass)
target_include_directories(fused_cutlass SYSTEM INTERFACE
  "${CUTLASS_DIR}/include" "${CUTLASS_DIR}/tools/util/include")
