// SPDX-License-Identifier: Apache-2.0
// Proves a consumer can include accel, construct the state and split a range.
#include <accel/state.hpp>

#include <iostream>
#include <vector>

int main() {
  accel::DistributedState state;
  std::vector<int> items{1, 2, 3, 4, 5};
  auto mine = state.split_between_processes(items);
  std::cout << "consumer ok: " << state << " items=" << mine.size() << "\n";
  return mine.size() == items.size() ? 0 : 1;
}
