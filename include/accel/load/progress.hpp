// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file progress.hpp
/// @brief A one-line progress bar for long loads (bytes, rate, ETA) on a terminal, redrawn at most
///        ten times a second; silent when the stream is not a TTY or when disabled.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief The progress line for `done` of `total` bytes after `seconds`: a bar of `width` cells,
///        percent, bytes, rate and ETA (`loading [####....]  50%  1.00 GiB / 2.00 GiB  ...`).
inline std::string format_progress(std::uint64_t done, std::uint64_t total, double seconds, int width = 24) {
  const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.append(static_cast<std::size_t>(width - filled), '.');
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  std::string eta = "--";
  if (rate > 0 && done < total) {
    const double left = static_cast<double>(total - done) / rate;
    char buf[32];
    if (left < 60) std::snprintf(buf, sizeof buf, "%.0fs", left);
    else std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(left) / 60, static_cast<int>(left) % 60);
    eta = buf;
  } else if (done >= total) {
    eta = "0s";
  }
  char pct[8];
  std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(frac * 100));
  return detail::concat("loading [", bar, "] ", pct, "  ", text::format_bytes(done, text::ByteStyle::significant3), " / ",
                        text::format_bytes(total, text::ByteStyle::significant3), "  ", text::format_bytes(rate, text::ByteStyle::significant3), "/s  ETA ", eta);
}

/// @brief Draws format_progress() on `out`, redrawing in place (carriage return, no newline until
///        finish()); load_checkpoint_and_dispatch draws one on stderr.
class ProgressBar {
 public:
  /// @param total bytes expected
  /// @param enabled false: draws nothing; true: draws only when `out` is a terminal
  ProgressBar(std::uint64_t total, bool enabled, std::FILE* out = stderr)
      : total_(total), out_(out), start_(std::chrono::steady_clock::now()) {
    active_ = enabled && out_ && ::isatty(::fileno(out_)) == 1;
  }
  /// @brief Adds bytes done; redraws when 100 ms have passed since the last draw.
  void add(std::uint64_t bytes) {
    done_ += bytes;
    if (!active_) return;
    const auto now = std::chrono::steady_clock::now();
    if (drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    draw(now);
  }
  /// @brief Final draw and newline (once).
  void finish() {
    if (!active_ || finished_) return;
    finished_ = true;
    draw(std::chrono::steady_clock::now());
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  /// @brief Whether it draws at all (enabled and `out` is a terminal).
  [[nodiscard]] bool active() const noexcept { return active_; }
  /// @brief Bytes added so far.
  [[nodiscard]] std::uint64_t done() const noexcept { return done_; }

 private:
  void draw(std::chrono::steady_clock::time_point now) {
    last_ = now;
    drawn_ = true;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(out_, "\r%s\x1b[K", format_progress(done_, total_, s).c_str());
    std::fflush(out_);
  }
  std::uint64_t total_, done_ = 0;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_, last_;
  bool active_ = false, drawn_ = false, finished_ = false;
};

ACCEL_NAMESPACE_END
