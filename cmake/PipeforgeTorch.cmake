# Which LibTorch Pipeforge builds against, and the Python that goes with it.
#
#   -DPIPEFORGE_TORCH=wheel   (default) the LibTorch inside the torch wheel of a
#                             Python venv: ${PIPEFORGE_VENV}/bin/python, made by
#                             scripts/install-deps.sh with torch==2.13.0 (CPU).
#                             Point PIPEFORGE_PYTHON at another interpreter to use
#                             its torch instead (a CUDA wheel, say).
#   -DPIPEFORGE_TORCH=system  Debian's libtorch-dev (1.13 on Debian 12, 2.6 on 13),
#                             with /usr/bin/python3 (Debian's python3-torch).
#   -DPIPEFORGE_TORCH=custom  whatever find_package(Torch) finds through Torch_DIR
#                             or CMAKE_PREFIX_PATH: an unpacked libtorch zip.
#
# The zoo and the Python checks always run with PIPEFORGE_PYTHON, whose torch
# must be the one we link: a model saved by a newer torch may not load in an
# older LibTorch.
#
# Sets: PIPEFORGE_PYTHON (cache), TORCH_* and Torch_VERSION from TorchConfig.

set(PIPEFORGE_TORCH "wheel" CACHE STRING "LibTorch to build against: wheel | system | custom")
set_property(CACHE PIPEFORGE_TORCH PROPERTY STRINGS wheel system custom)
set(PIPEFORGE_VENV "${PROJECT_SOURCE_DIR}/.venv" CACHE PATH "Virtual environment whose torch wheel the wheel build uses")

if(PIPEFORGE_TORCH STREQUAL "wheel")
  set(PIPEFORGE_PYTHON "${PIPEFORGE_VENV}/bin/python" CACHE FILEPATH "Python whose torch we link against; runs the zoo and the Python checks")
  if(NOT EXISTS "${PIPEFORGE_PYTHON}")
    message(FATAL_ERROR "PIPEFORGE_TORCH=wheel needs a Python with torch at ${PIPEFORGE_PYTHON}. "
                        "Run `bash scripts/install-deps.sh` (it makes .venv with torch==2.13.0), or pass "
                        "-DPIPEFORGE_PYTHON=/path/to/python, or build Debian's LibTorch with -DPIPEFORGE_TORCH=system.")
  endif()
  execute_process(
    COMMAND "${PIPEFORGE_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _pf_torch_out ERROR_VARIABLE _pf_torch_err RESULT_VARIABLE _pf_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _pf_torch_rc EQUAL 0)
    message(FATAL_ERROR "${PIPEFORGE_PYTHON} cannot import torch:\n${_pf_torch_err}\n"
                        "Run `bash scripts/install-deps.sh`, which installs torch==2.13.0 into ${PIPEFORGE_VENV}.")
  endif()
  string(REPLACE "\n" ";" _pf_torch_out "${_pf_torch_out}")
  list(GET _pf_torch_out 0 PIPEFORGE_TORCH_PACKAGE)
  list(GET _pf_torch_out 1 _pf_torch_cmake)
  # TorchConfig.cmake looks for its libraries with find_library(... PATHS
  # <wheel>/lib), and PATHS come after the system directories: with Debian's
  # libtorch-dev installed too it would pick /usr/lib's libtorch.so (1.13)
  # under the wheel's 2.13 headers. Searching the wheel first keeps them a pair.
  list(PREPEND CMAKE_LIBRARY_PATH "${PIPEFORGE_TORCH_PACKAGE}/lib")
  list(PREPEND CMAKE_PREFIX_PATH "${_pf_torch_cmake}")
  # A CUDA wheel's TorchConfig links NVRTC from the CUDA toolkit. A toolkit
  # of nvcc and cudart alone has none; the wheel's nvidia-cu* dependency
  # ships it (libnvrtc.so.13, no unversioned name), so look there second.
  get_filename_component(_pf_site "${PIPEFORGE_TORCH_PACKAGE}" DIRECTORY)
  file(GLOB _pf_cu_libs LIST_DIRECTORIES true "${_pf_site}/nvidia/cu[0-9]*/lib")
  if(_pf_cu_libs)
    find_library(CUDA_nvrtc_LIBRARY NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12
                 HINTS "${CUDAToolkit_ROOT}/lib64" "${CUDA_TOOLKIT_ROOT_DIR}/lib64" ${_pf_cu_libs})
  endif()
  find_package(Torch REQUIRED)
  if(NOT TORCH_LIBRARY MATCHES "^${PIPEFORGE_TORCH_PACKAGE}/")
    message(FATAL_ERROR "The torch wheel at ${PIPEFORGE_TORCH_PACKAGE} resolved its library to ${TORCH_LIBRARY}. "
                        "Remove the stale CMake cache (rm -rf the build folder) and configure again.")
  endif()
elseif(PIPEFORGE_TORCH STREQUAL "system")
  set(PIPEFORGE_PYTHON "/usr/bin/python3" CACHE FILEPATH "Python whose torch we link against; runs the zoo and the Python checks")
  find_package(Torch REQUIRED PATHS /usr/share/cmake/Torch /usr/lib/x86_64-linux-gnu/cmake/Torch NO_DEFAULT_PATH)
elseif(PIPEFORGE_TORCH STREQUAL "custom")
  set(PIPEFORGE_PYTHON "python3" CACHE FILEPATH "Python whose torch matches the LibTorch we link; runs the zoo and the Python checks")
  find_package(Torch REQUIRED)
else()
  message(FATAL_ERROR "PIPEFORGE_TORCH is '${PIPEFORGE_TORCH}'; use wheel, system or custom.")
endif()
# LibTorch 2.14 and newer need C++20 (ATen/ATen.h refuses anything older);
# every target made from here on (all that include torch) is compiled so.
# common/ and schedules/, made before this, stay C++17: they must also build
# without LibTorch, and the two standards link together with one compiler.
set(_pf_aten_h "")
foreach(_pf_inc IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${_pf_inc}/ATen/ATen.h")
    set(_pf_aten_h "${_pf_inc}/ATen/ATen.h")
    break()
  endif()
endforeach()
if(_pf_aten_h)
  file(STRINGS "${_pf_aten_h}" _pf_cxx20 REGEX "__cplusplus < 202002L")
  if(_pf_cxx20)
    set(CMAKE_CXX_STANDARD 20)
    message(STATUS "Pipeforge: LibTorch ${Torch_VERSION} needs C++20; its targets are compiled as C++20")
  endif()
endif()

# The zoo's Python must carry the same torch release as the LibTorch we link.
execute_process(COMMAND "${PIPEFORGE_PYTHON}" -c "import torch; print(torch.__version__.split('+')[0])"
  OUTPUT_VARIABLE PIPEFORGE_PYTHON_TORCH_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _pf_py_mm "${PIPEFORGE_PYTHON_TORCH_VERSION}")
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _pf_lib_mm "${Torch_VERSION}")
if(NOT _pf_py_mm STREQUAL _pf_lib_mm)
  message(FATAL_ERROR "PIPEFORGE_PYTHON (${PIPEFORGE_PYTHON}) has torch '${PIPEFORGE_PYTHON_TORCH_VERSION}', but "
                      "we link LibTorch ${Torch_VERSION}: the zoo it saves may not load. Point PIPEFORGE_PYTHON at "
                      "a Python with torch ${_pf_lib_mm}.")
endif()
message(STATUS "Pipeforge: LibTorch ${Torch_VERSION} (${PIPEFORGE_TORCH}) from ${TORCH_LIBRARY}; "
               "Python ${PIPEFORGE_PYTHON} (torch ${PIPEFORGE_PYTHON_TORCH_VERSION})")

# c10d's ProcessGroupGloo.hpp includes <gloo/...>, but neither the wheel nor
# the libtorch zip ships Gloo's headers (Gloo is linked into libtorch_cpu.so).
# Debian's libgloo-dev supplies them. We only pass Gloo objects by shared_ptr
# and call c10d's out-of-line functions, so the headers' version need not match
# the Gloo inside libtorch byte for byte; the runtime tests prove the pairing.
find_path(PIPEFORGE_GLOO_INCLUDE_DIR gloo/config.h HINTS "${PIPEFORGE_TORCH_PACKAGE}/include")
if(NOT PIPEFORGE_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "Gloo's headers (gloo/config.h) were not found; c10d's Gloo process group needs them. "
                      "Install Debian's libgloo-dev (scripts/install-deps.sh does).")
endif()
