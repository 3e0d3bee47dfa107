# SPDX-License-Identifier: Apache-2.0
# Helpers for accel's own targets (never applied to consumers).

# accel_target_warnings(<target>): the warning set every accel-owned target compiles with.
function(accel_target_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
    if(ACCEL_WARNINGS_AS_ERRORS)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
  endif()
endfunction()
