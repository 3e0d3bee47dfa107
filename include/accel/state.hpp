// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file state.hpp
/// @brief The entry point of every inference program: `accel::DistributedState` (who this process
///        is, which device is its own) and `split_between_processes`.
///
/// Light on purpose: no JSON library, no store, no planner, no loader. Add
/// `<accel/comm/collectives.hpp>` to gather results, `<accel/plan/planner.hpp>` and
/// `<accel/load/dispatch.hpp>` to place and load a model, or `<accel/accel.hpp>` for everything.
/// @code
///   #include <accel/state.hpp>
///   accel::DistributedState state;
///   for (const auto& prompt : state.split_between_processes(prompts)) run(prompt, state.device());
/// @endcode
#pragma once

#include <accel/runtime/distributed_state.hpp>
#include <accel/runtime/split.hpp>
