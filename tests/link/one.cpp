// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Two translation units include every header and link into one program: no ODR clash, no non-inline
// definition in a header.
#include <accel/accel.hpp>

int accel_link_test_other();

int main() {
  accel::DistributedState state(accel::map_env({}), accel::cpu_only_device_query());
  return state.process_index() + accel_link_test_other();
}
