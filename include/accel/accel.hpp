// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file accel.hpp
/// @brief Umbrella header: everything a user program needs.
#pragma once

#include "collectives.hpp"
#include "state.hpp"
