# Finds the optional dependencies. Each ACCEL_WITH_* option defaults to ON when its
# dependency is found; asking for one whose dependency is missing switches it off with the
# reason in the one-line summary printed at the end.

set(_accel_found "")
set(_accel_off "")

find_package(Threads REQUIRED)

# Gloo (Debian's libgloo-dev); its config exports the imported target `gloo`.
find_package(Gloo CONFIG QUIET)
option(ACCEL_WITH_GLOO "Build the Gloo communicator (CPU, TCP)" ON)
if(ACCEL_WITH_GLOO AND NOT Gloo_FOUND)
  set(ACCEL_WITH_GLOO OFF CACHE BOOL "" FORCE)
  list(APPEND _accel_off "gloo (libgloo-dev not found)")
elseif(ACCEL_WITH_GLOO)
  list(APPEND _accel_found "gloo ${GLOO_VERSION}")
else()
  list(APPEND _accel_off "gloo (ACCEL_WITH_GLOO=OFF)")
endif()

# Shared memory between ranks of one host: POSIX shm and Linux futexes, nothing to find.
cmake_dependent_option(ACCEL_WITH_SHM "Build the shared-memory communicator (ranks on one host)" ON
  "CMAKE_SYSTEM_NAME STREQUAL Linux" OFF)
if(ACCEL_WITH_SHM)
  list(APPEND _accel_found "shm")
else()
  list(APPEND _accel_off "shm (ACCEL_WITH_SHM=OFF or not Linux)")
endif()

# MPI (OpenMPI).
find_package(MPI COMPONENTS C QUIET)
cmake_dependent_option(ACCEL_WITH_MPI "Build the MPI communicator" ON "MPI_C_FOUND" OFF)
if(ACCEL_WITH_MPI)
  find_program(ACCEL_MPIEXEC NAMES mpirun mpiexec)
  list(APPEND _accel_found "mpi ${MPI_C_VERSION}")
elseif(NOT MPI_C_FOUND)
  list(APPEND _accel_off "mpi (libopenmpi-dev not found)")
else()
  list(APPEND _accel_off "mpi (ACCEL_WITH_MPI=OFF)")
endif()

# NCCL from the CUDA toolkit in /usr/local/cuda: compiled and linked here, run where a GPU is.
find_package(CUDAToolkit QUIET PATHS /usr/local/cuda)
if(NOT CUDAToolkit_FOUND AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CUDAToolkit_ROOT /usr/local/cuda)
  find_package(CUDAToolkit QUIET)
endif()
find_path(ACCEL_NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
find_library(ACCEL_NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 ${CUDAToolkit_LIBRARY_DIR})
if(CUDAToolkit_FOUND AND ACCEL_NCCL_INCLUDE_DIR AND ACCEL_NCCL_LIBRARY)
  set(_accel_nccl_ok ON)
else()
  set(_accel_nccl_ok OFF)
endif()
cmake_dependent_option(ACCEL_WITH_NCCL "Build the NCCL communicator (CUDA)" ON "_accel_nccl_ok" OFF)
if(ACCEL_WITH_NCCL)
  list(APPEND _accel_found "nccl (cuda ${CUDAToolkit_VERSION})")
elseif(NOT CUDAToolkit_FOUND)
  list(APPEND _accel_off "nccl (CUDA toolkit not found)")
elseif(NOT _accel_nccl_ok)
  list(APPEND _accel_off "nccl (nccl.h or libnccl not found)")
else()
  list(APPEND _accel_off "nccl (ACCEL_WITH_NCCL=OFF)")
endif()

# CUDA device code (the optimizer kernels in backends/optim/cuda, examples/raw_cuda): nvcc
# from CMAKE_CUDA_COMPILER or /usr/local/cuda; compiled and linked here, run where a GPU is.
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
  set(_accel_cuda_ok ON)
else()
  set(_accel_cuda_ok OFF)
endif()
cmake_dependent_option(ACCEL_WITH_CUDA "Build the CUDA kernels (optimizers, clipping, loss scaling) and examples/raw_cuda" ON "_accel_cuda_ok" OFF)
if(ACCEL_WITH_CUDA)
  # H200 (sm_90) only by default, so the build stays fast; -DCMAKE_CUDA_ARCHITECTURES="80;90" for more.
  set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "GPU architectures the CUDA code is compiled for")
  # nvcc drives the host compiler the C++ code uses (Debian 12: g++ 12, which nvcc 13 accepts).
  if(NOT CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER} CACHE FILEPATH "Host compiler for nvcc")
  endif()
  # The shared runtime, as accel_comm_nccl uses: one cudart per process, so the device NCCL set
  # is the device the kernels run on.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  # C++20 in .cu files. CMake 3.25 knows no CUDA20 flag for nvcc (CUDA_STANDARD 20 is a
  # configure error), so the flag is passed by hand.
  function(accel_cuda_cxx20 target)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endfunction()
  list(APPEND _accel_found "cuda kernels (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_${CMAKE_CUDA_ARCHITECTURES})")
elseif(NOT CMAKE_CUDA_COMPILER)
  list(APPEND _accel_off "cuda kernels (nvcc not found)")
elseif(NOT CUDAToolkit_FOUND)
  list(APPEND _accel_off "cuda kernels (CUDA toolkit not found)")
else()
  list(APPEND _accel_off "cuda kernels (ACCEL_WITH_CUDA=OFF)")
endif()

# LibTorch (Debian's libtorch-dev); not even looked for with -DACCEL_WITH_TORCH=OFF (its
# config is slow, and scripts/gpu_check.sh needs none of it).
if(DEFINED ACCEL_WITH_TORCH AND NOT ACCEL_WITH_TORCH)
  set(_accel_torch_off_by_hand ON)
else()
  find_package(Torch QUIET)
endif()
cmake_dependent_option(ACCEL_WITH_TORCH "Build the LibTorch adapter and examples" ON "Torch_FOUND" OFF)
if(_accel_torch_off_by_hand)
  list(APPEND _accel_off "torch (ACCEL_WITH_TORCH=OFF)")
elseif(ACCEL_WITH_TORCH)
  list(APPEND _accel_found "torch ${Torch_VERSION}")
elseif(NOT Torch_FOUND)
  list(APPEND _accel_off "torch (libtorch-dev not found)")
else()
  list(APPEND _accel_off "torch (ACCEL_WITH_TORCH=OFF)")
endif()

find_package(doctest QUIET)

list(JOIN _accel_found ", " _found_text)
list(JOIN _accel_off ", " _off_text)
if(NOT _off_text)
  set(_off_text "none")
endif()
message(STATUS "accelerate-cpp: found ${_found_text}; switched off: ${_off_text}")
