// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file devices.hpp
/// @brief Devices, the device-query seam with its real (CUDA runtime) implementation, and CUDA_VISIBLE_DEVICES parsing.
#pragma once

#include <accel/runtime/config.hpp>
#include <accel/runtime/detail/cuda_devices.hpp>
#include <accel/runtime/device.hpp>
#include <accel/runtime/visible_devices.hpp>

ACCEL_NAMESPACE_BEGIN
/// @brief The real device query: the CUDA runtime when compiled in, else no GPUs.
inline DeviceQuery default_device_query() {
#if ACCEL_HAS_CUDA()
  return detail::cuda_device_query();
#else
  return cpu_only_device_query();
#endif
}

/// @brief Number of GPUs this process sees (0 with no driver, no device, or a CPU-only build).
inline int visible_gpu_count() { return static_cast<int>(default_device_query().list(false).gpus.size()); }
ACCEL_NAMESPACE_END
