# Finds the optional backends. FUSEDOPT_CUDA, FUSEDOPT_NCCL and FUSEDOPT_MPI are AUTO, ON or
# OFF: AUTO turns a backend on where it is found and off with a warning where it is not; ON
# makes a missing one an error. Sets FUSEDOPT_HAVE_CUDA (with FUSEDOPT_CUDA_INCLUDE_DIRS),
# FUSEDOPT_HAVE_NCCL (with FUSEDOPT_NCCL_INCLUDE_DIR) and FUSEDOPT_HAVE_MPI, and records
# each in the feature summary. No CUDA library is linked: NVRTC and the driver are
# dlopen'ed at run time, so CUDA needs only the toolkit's headers at build time.

# fusedopt_backend_missing(NAME WHY): an error for ON, a warning for AUTO.
function(fusedopt_backend_missing name why)
  if(FUSEDOPT_${name} STREQUAL "ON")
    message(FATAL_ERROR "FUSEDOPT_${name}=ON but ${why}")
  endif()
  message(WARNING "fusedopt: ${why}; building without ${name}")
endfunction()

foreach(backend CUDA NCCL MPI)
  if(NOT FUSEDOPT_${backend} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "FUSEDOPT_${backend} must be AUTO, ON or OFF (not '${FUSEDOPT_${backend}}')")
  endif()
endforeach()

# CUDA: the toolkit's include directory (cuda.h, nvrtc.h).
set(FUSEDOPT_HAVE_CUDA OFF)
if(NOT FUSEDOPT_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND DEFINED ENV{CUDA_HOME})
    set(CUDAToolkit_ROOT "$ENV{CUDA_HOME}")
  endif()
  find_package(CUDAToolkit QUIET)
  set(FUSEDOPT_CUDA_HEADERS OFF)
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(EXISTS "${dir}/cuda.h" AND EXISTS "${dir}/nvrtc.h")
      set(FUSEDOPT_CUDA_HEADERS ON)
    endif()
  endforeach()
  if(CUDAToolkit_FOUND AND FUSEDOPT_CUDA_HEADERS)
    set(FUSEDOPT_HAVE_CUDA ON)
    set(FUSEDOPT_CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
    message(STATUS "fusedopt: CUDA ${CUDAToolkit_VERSION} headers in ${CUDAToolkit_INCLUDE_DIRS}")
  else()
    fusedopt_backend_missing(CUDA "the CUDA toolkit (cuda.h, nvrtc.h) was not found")
  endif()
endif()
add_feature_info(FUSEDOPT_CUDA FUSEDOPT_HAVE_CUDA
  "NVRTC kernels for sm_XX and CUDA tensors (off: host kernels only; CUDA tests skip)")

# NCCL: nccl.h under the CUDA toolkit or the system's include directories.
set(FUSEDOPT_HAVE_NCCL OFF)
if(NOT FUSEDOPT_NCCL STREQUAL "OFF")
  find_path(FUSEDOPT_NCCL_INCLUDE_DIR NAMES nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME ENV NCCL_ROOT PATH_SUFFIXES include)
  if(FUSEDOPT_NCCL_INCLUDE_DIR AND FUSEDOPT_HAVE_CUDA)
    set(FUSEDOPT_HAVE_NCCL ON)
    message(STATUS "fusedopt: NCCL headers in ${FUSEDOPT_NCCL_INCLUDE_DIR}")
  elseif(FUSEDOPT_NCCL_INCLUDE_DIR)
    fusedopt_backend_missing(NCCL "NCCL needs CUDA, which is off")
  else()
    fusedopt_backend_missing(NCCL "nccl.h was not found")
  endif()
endif()
add_feature_info(FUSEDOPT_NCCL FUSEDOPT_HAVE_NCCL
  "GPU collectives for the comm module (off: no NCCL communicator)")

# MPI: the C API (the comm module's host collectives; tests run under mpiexec).
set(FUSEDOPT_HAVE_MPI OFF)
if(NOT FUSEDOPT_MPI STREQUAL "OFF")
  # The C API through the CXX component (this project enables no C compiler); without the
  # deprecated C++ bindings.
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(FUSEDOPT_HAVE_MPI ON)
    message(STATUS "fusedopt: MPI ${MPI_CXX_VERSION} (${MPI_CXX_INCLUDE_DIRS})")
  else()
    fusedopt_backend_missing(MPI "MPI (mpi.h and its library) was not found")
  endif()
endif()
add_feature_info(FUSEDOPT_MPI FUSEDOPT_HAVE_MPI
  "multi-process runs for the comm module (off: no MPI communicator; multi-rank tests skip)")
