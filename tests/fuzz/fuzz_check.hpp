// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Shared by the libFuzzer harnesses: an invariant that must hold, or the run aborts (a finding).
#pragma once

#include <cstdlib>

namespace accel_fuzz {
inline void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace accel_fuzz
