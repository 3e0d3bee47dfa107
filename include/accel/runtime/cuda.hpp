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
#include <new>
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

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Makes `device` current for its lifetime and restores the caller's device after (it is
///        only changed when it differs), so a library call never leaves the caller on another GPU.
/// @brief The three runtime calls ScopedCudaDevice makes; a communicator passes its own table
///        (tests simulate the GPU through it).
struct CudaDeviceCalls {
  cudaError_t (*get_device)(int*) = &cudaGetDevice;
  cudaError_t (*set_device)(int) = &cudaSetDevice;
  cudaError_t (*get_last_error)() = &cudaGetLastError;
};

class ScopedCudaDevice {
 public:
  /// @throws accel::cuda_error when `device` cannot be made current
  explicit ScopedCudaDevice(int device, CudaDeviceCalls calls = {}) : calls_(calls) {
    if (const cudaError_t rc = enter(device); rc != cudaSuccess) cuda_fail(rc, "cudaSetDevice(device)", __FILE__, __LINE__);
  }
  /// @brief For cleanup paths: a failure is logged, never thrown.
  ScopedCudaDevice(int device, std::nothrow_t, CudaDeviceCalls calls = {}) noexcept : calls_(calls) {
    if (const cudaError_t rc = enter(device); rc != cudaSuccess) cuda_log_failure(rc, "cudaSetDevice(device)", __FILE__, __LINE__);
  }
  ~ScopedCudaDevice() {
    if (changed_ && calls_.set_device(previous_) != cudaSuccess) (void)calls_.get_last_error();
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

 private:
  cudaError_t enter(int device) noexcept {
    if (calls_.get_device(&previous_) != cudaSuccess) (void)calls_.get_last_error(), previous_ = -1;
    if (previous_ == device) return cudaSuccess;
    const cudaError_t rc = calls_.set_device(device);
    changed_ = rc == cudaSuccess && previous_ >= 0;
    if (rc != cudaSuccess) (void)calls_.get_last_error();
    return rc;
  }
  CudaDeviceCalls calls_;
  int previous_ = -1;
  bool changed_ = false;
};

}  // namespace detail
ACCEL_NAMESPACE_END

#endif
