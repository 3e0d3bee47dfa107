// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file accel.hpp
/// @brief Umbrella header: every public part of accel (the launcher's internals excepted).
#pragma once

#include "state.hpp"
#include "collectives.hpp"
#include "module_tree.hpp"
#include "memory.hpp"
#include "planner.hpp"
#include "plan_report.hpp"
#include "dispatch.hpp"
#include "offload.hpp"
