// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The second translation unit of the link test.
#include <accel/accel.hpp>

int accel_link_test_other() { return accel::split_between_processes(std::vector<int>{1, 2}, 0, 2).size() == 1 ? 0 : 1; }
