// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file cuda.hpp
/// @brief Checked CUDA runtime calls: `ACCEL_CUDA_TRY(call)` throws accel::cuda_error naming the
///        call, file:line and the error; `ACCEL_CUDA_TRY_NO_THROW(call)` logs to stderr instead
///        (for destructors and cleanup). Only defined when CUDA is compiled in.
#pragma once

#include <accel/runtime/config.hpp>

#if ACCEL_HAS_CUDA()
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief "cudaMalloc(&p, n) failed at file.hpp:42: cudaErrorMemoryAllocation (out of memory)".
inline std::string cuda_failure_text(cudaError_t rc, const char* call, const char* file, int line) {
  return concat(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(rc), " (", cudaGetErrorString(rc), ")");
}

/// @brief Throws cuda_error for a failed call; clears the sticky last error first so later calls
///        are not poisoned by this one.
[[noreturn]] inline void cuda_fail(cudaError_t rc, const char* call, const char* file, int line,
                                   const std::string& context = {}) {
  (void)cudaGetLastError();
  throw cuda_error(static_cast<int>(rc),
                   cuda_failure_text(rc, call, file, line) + (context.empty() ? std::string() : "; " + context));
}

/// @brief Logs a failed call to stderr (never throws): the `_NO_THROW` twin's body.
inline void cuda_log_failure(cudaError_t rc, const char* call, const char* file, int line) noexcept {
  (void)cudaGetLastError();
  std::fprintf(stderr, "[accel.cuda] %s failed at %s:%d: %s (%s) (ignored during cleanup)\n", call, file, line,
               cudaGetErrorName(rc), cudaGetErrorString(rc));
}

}  // namespace detail
ACCEL_NAMESPACE_END

/// @brief Runs a CUDA runtime call; on failure throws accel::cuda_error naming the call text,
///        file:line, the error name and string.
#define ACCEL_CUDA_TRY(call)                                                               \
  do {                                                                                     \
    const cudaError_t accel_detail_rc = (call);                                            \
    if (accel_detail_rc != cudaSuccess)                                                    \
      ::accel::detail::cuda_fail(accel_detail_rc, #call, __FILE__, __LINE__);              \
  } while (false)

/// @brief As ACCEL_CUDA_TRY but logs to stderr instead of throwing (destructors, cleanup).
#define ACCEL_CUDA_TRY_NO_THROW(call)                                                      \
  do {                                                                                     \
    const cudaError_t accel_detail_rc = (call);                                            \
    if (accel_detail_rc != cudaSuccess)                                                    \
      ::accel::detail::cuda_log_failure(accel_detail_rc, #call, __FILE__, __LINE__);       \
  } while (false)

#endif
