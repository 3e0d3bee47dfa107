// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file config.hpp
/// @brief The one place that decides which optional backends (CUDA runtime, NCCL) are compiled in.
///
/// CMake defines ACCEL_WITH_CUDA / ACCEL_WITH_NCCL (0 or 1) on the accel::accel target. Users of the
/// bare headers may define them themselves; a user definition always wins. Code tests the
/// function-like predicates ACCEL_HAS_CUDA() / ACCEL_HAS_NCCL(), so a forgotten include of this
/// header is a preprocessor error rather than a silent "off".
#pragma once

#include <accel/runtime/version.hpp>

#ifndef ACCEL_WITH_CUDA
#define ACCEL_WITH_CUDA 0
#endif
#ifndef ACCEL_WITH_NCCL
#define ACCEL_WITH_NCCL 0
#endif

#define ACCEL_HAS_CUDA() (ACCEL_WITH_CUDA)
#define ACCEL_HAS_NCCL() (ACCEL_WITH_NCCL)

#if ACCEL_WITH_NCCL && !ACCEL_WITH_CUDA
#error "accel: ACCEL_WITH_NCCL=1 needs ACCEL_WITH_CUDA=1 (NCCL runs on the CUDA runtime); build with ACCEL_WITH_NCCL=OFF or enable CUDA"
#endif
#if ACCEL_WITH_CUDA && defined(__has_include)
#if !__has_include(<cuda_runtime_api.h>)
#error "accel: ACCEL_WITH_CUDA=1 but <cuda_runtime_api.h> is not on the include path; add the CUDA toolkit's include directory or build with ACCEL_WITH_CUDA=OFF"
#endif
#endif
#if ACCEL_WITH_NCCL && defined(__has_include)
#if !__has_include(<nccl.h>)
#error "accel: ACCEL_WITH_NCCL=1 but <nccl.h> is not on the include path; add NCCL's include directory or build with ACCEL_WITH_NCCL=OFF"
#endif
#endif

// Everything lives in an inline namespace tagged by version and backends, so two translation units
// built with different settings cannot silently share (and disagree on) one class layout.
#define ACCEL_DETAIL_CAT2(a, b, c, d) accel_v##a##_cuda##b##_nccl##c##d
#define ACCEL_DETAIL_CAT(a, b, c, d) ACCEL_DETAIL_CAT2(a, b, c, d)
#define ACCEL_ABI_NAMESPACE ACCEL_DETAIL_CAT(ACCEL_VERSION_MAJOR, ACCEL_WITH_CUDA, ACCEL_WITH_NCCL, )
#define ACCEL_NAMESPACE_BEGIN \
  namespace accel {           \
  inline namespace ACCEL_ABI_NAMESPACE {
#define ACCEL_NAMESPACE_END \
  }                         \
  }

ACCEL_NAMESPACE_BEGIN
/// @brief True when the CUDA runtime is compiled in (prefer `if constexpr` over `#if` in bodies).
inline constexpr bool cuda_enabled = ACCEL_WITH_CUDA != 0;
/// @brief True when NCCL is compiled in.
inline constexpr bool nccl_enabled = ACCEL_WITH_NCCL != 0;
ACCEL_NAMESPACE_END
