// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file cuda_devices.hpp
/// @brief CUDA-runtime implementation of the device query (only compiled when CUDA is in use).
#pragma once

#include <accel/runtime/config.hpp>
#include <accel/runtime/device.hpp>

#if ACCEL_HAS_CUDA()
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from the 16 UUID bytes, as nvidia-smi prints it.
inline std::string format_gpu_uuid(const unsigned char (&bytes)[16]) {
  std::string out = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex, sizeof hex, "%02x", bytes[i]);
    out += hex;
  }
  return out;
}

inline DeviceQuery cuda_device_query() {
  DeviceQuery q;
  q.list = [](bool with_free_memory) {
    DeviceList out;
    int driver = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0)
      out.driver = std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
    int count = 0;  // the runtime leaves it unwritten on failure
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error so later calls are not poisoned
      out.status = rc == cudaErrorNoDevice             ? "no CUDA device"
                   : rc == cudaErrorInsufficientDriver ? "insufficient driver"
                                                       : std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
      return out;
    }
    if (count == 0) out.status = "no CUDA device";
    int current = -1;
    if (with_free_memory) (void)cudaGetDevice(&current);
    for (int i = 0; i < count; ++i) {
      DeviceInfo info;
      info.index = i;
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
        info.name = prop.name;
        info.total_memory = prop.totalGlobalMem;
        unsigned char uuid[16];
        for (int b = 0; b < 16; ++b) uuid[b] = static_cast<unsigned char>(prop.uuid.bytes[b]);
        info.uuid = format_gpu_uuid(uuid);
      }
      if (with_free_memory && cudaSetDevice(i) == cudaSuccess) {
        std::size_t free_bytes = 0, total_bytes = 0;
        if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) info.free_memory = free_bytes;
      }
      (void)cudaGetLastError();
      out.gpus.push_back(std::move(info));
    }
    if (with_free_memory && current >= 0) (void)cudaSetDevice(current);
    return out;
  };
  q.make_current = [](int index) {
    const cudaError_t rc = cudaSetDevice(index);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(static_cast<int>(rc), concat("cudaSetDevice(", index, ") failed: ", cudaGetErrorName(rc), ": ",
                                                   cudaGetErrorString(rc)));
    }
  };
  return q;
}

}  // namespace detail
ACCEL_NAMESPACE_END
#endif
