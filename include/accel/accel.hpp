// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file accel.hpp
/// @brief Umbrella header: the public headers of every layer (the launcher's process supervision
///        excepted; that is the `accel launch` command's business).
#pragma once

#include <accel/state.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/comm/p2p.hpp>
#include <accel/model/checkpoint_tree.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/skeleton.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/plan_report.hpp>
#include <accel/plan/planner.hpp>
#include <accel/plan/pipeline_plan.hpp>
#include <accel/load/auto_dispatch.hpp>
#include <accel/load/dispatch.hpp>
#include <accel/load/offload.hpp>
