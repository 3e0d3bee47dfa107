# SPDX-License-Identifier: Apache-2.0
# Finds NCCL and provides the imported target NCCL::nccl.
# Hints: NCCL_ROOT, NCCL_HOME, CUDAToolkit_LIBRARY_ROOT. Sets NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR.
# Also finds the NCCL of a Python wheel (nvidia-nccl-cu*: NCCL_ROOT=<site-packages>/nvidia/nccl),
# which ships only the versioned libnccl.so.2.
find_package(NCCL CONFIG QUIET NO_MODULE)
if(NOT TARGET NCCL::nccl)
  set(nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${NCCL_HOME} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${nccl_hints} PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${nccl_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" nccl_version_lines REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
    foreach(line IN LISTS nccl_version_lines)
      if(line MATCHES "NCCL_(MAJOR|MINOR|PATCH) +([0-9]+)")
        set(nccl_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
      endif()
    endforeach()
    if(DEFINED nccl_MAJOR)
      set(NCCL_VERSION "${nccl_MAJOR}.${nccl_MINOR}.${nccl_PATCH}")
    endif()
  endif()
  include(FindPackageHandleStandardArgs)
  find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
  if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
else()
  set(NCCL_FOUND TRUE)
endif()
