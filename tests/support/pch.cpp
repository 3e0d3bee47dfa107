// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The translation unit that owns the tests' precompiled header.
#include "pch.hpp"
