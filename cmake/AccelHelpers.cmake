# SPDX-License-Identifier: Apache-2.0
# Helpers for accel's own targets (never applied to consumers).

# The warning set every accel-owned compile uses (targets, and the layout test's header checks).
set(ACCEL_WARNING_FLAGS "")
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(ACCEL_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
  if(ACCEL_WARNINGS_AS_ERRORS)
    list(APPEND ACCEL_WARNING_FLAGS -Werror)
  endif()
endif()

# accel_target_warnings(<target>): applies ACCEL_WARNING_FLAGS to one of accel's targets.
function(accel_target_warnings target)
  target_compile_options(${target} PRIVATE ${ACCEL_WARNING_FLAGS})
endfunction()
