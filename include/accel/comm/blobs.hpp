// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file blobs.hpp
/// @brief Blobs: one byte string per rank, held in a single buffer (what all-gathers return).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Per-rank byte strings in rank order: stored back to back in one buffer (no per-rank
/// allocation), or viewed where they already are (another process's shared-memory segment, kept
/// mapped by `owners`).
///
/// @note Parts a CPU backend views in shared memory stay valid until that communicator's
/// next-but-one collective (the sender then reuses the segment); copy what you keep longer.
struct Blobs {
  std::vector<std::byte> buffer;             ///< parts stored here, possibly with framing bytes in between
  std::vector<std::size_t> offset;           ///< where part i starts in `buffer`
  std::vector<std::size_t> length;           ///< how long part i is
  std::vector<const std::byte*> external;    ///< non-null: part i lives here instead (kept alive by owners)
  std::vector<std::shared_ptr<const void>> owners;

  /// @brief Number of parts (the world size for a gather).
  [[nodiscard]] std::size_t size() const noexcept { return offset.size(); }
  /// @brief Part i.
  /// @throws usage_error when i >= size()
  [[nodiscard]] std::span<const std::byte> operator[](std::size_t i) const {
    ACCEL_EXPECTS(i < size(), "Blobs: part ", i, " requested of ", size());
    if (i < external.size() && external[i]) return std::span<const std::byte>(external[i], length[i]);
    return std::span<const std::byte>(buffer.data() + offset[i], length[i]);
  }
  /// @brief Appends a part that stays where it is, alive as long as `owner`.
  void push_external(std::span<const std::byte> part, std::shared_ptr<const void> owner) {
    external.resize(offset.size());
    external.push_back(part.data());
    offset.push_back(0);
    length.push_back(part.size());
    owners.push_back(std::move(owner));
  }
  /// @brief Appends a part, copying it.
  void push_back(std::span<const std::byte> part) {
    offset.push_back(buffer.size());
    length.push_back(part.size());
    buffer.insert(buffer.end(), part.begin(), part.end());
  }
  /// @brief Extends the part push_back() added last with more bytes.
  /// @throws usage_error when there is no part, or the last one is external
  void append_to_last(std::span<const std::byte> more) {
    ACCEL_EXPECTS(!offset.empty() && (external.size() < offset.size() || !external.back()) &&
                      offset.back() + length.back() == buffer.size(),
                  "Blobs: append_to_last needs a last part stored in the buffer");
    buffer.insert(buffer.end(), more.begin(), more.end());
    length.back() += more.size();
  }
};

ACCEL_NAMESPACE_END
