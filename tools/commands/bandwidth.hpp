// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Transfer rates for the planner's estimates: measured by `accel env --measure-bandwidth` (host →
// GPU copy, disk read), cached as JSON, read back by `accel plan`. The timing sits behind
// BandwidthProbe so the arithmetic and the cache are tested without a GPU or a disk.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/plan/plan_options.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/env.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

#if ACCEL_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

namespace accel_cli {

/// Rates with where they came from.
struct MeasuredBandwidths {
  accel::Bandwidths rates{};
  std::string host_source;  ///< how the host → GPU rate was measured
  std::string disk_source;  ///< which folder's disk was read
};

/// The timing seam: each call copies or reads `bytes` once and returns the seconds it took.
struct BandwidthProbe {
  std::function<double(std::uint64_t bytes)> host_to_device;
  std::function<double(const std::filesystem::path& dir, std::uint64_t bytes)> disk_read;
  std::string host_source;
};

/// Bytes per second of the fastest of `seconds` (each one transfer of `bytes`): the rate the link
/// sustains without interference. Non-positive or missing samples are refused.
inline double rate_of(std::uint64_t bytes, const std::vector<double>& seconds) {
  double best = 0;
  for (double s : seconds)
    if (s > 0) best = std::max(best, static_cast<double>(bytes) / s);
  if (best <= 0)
    throw accel::unavailable_error("bandwidth measurement took no measurable time (" + std::to_string(seconds.size()) +
                                   " samples of " + std::to_string(bytes) + " bytes); the clock is too coarse");
  return best;
}

/// Runs the probe: three host → GPU copies of `host_bytes`, then one read of a `disk_bytes` file in `dir`.
inline MeasuredBandwidths measure_bandwidths(const BandwidthProbe& probe, const std::filesystem::path& dir,
                                             std::uint64_t host_bytes = 256ull << 20, std::uint64_t disk_bytes = 128ull << 20) {
  MeasuredBandwidths m;
  std::vector<double> copies;
  for (int i = 0; i < 3; ++i) copies.push_back(probe.host_to_device(host_bytes));
  m.rates.host_to_device = rate_of(host_bytes, copies);
  m.host_source = probe.host_source;
  m.rates.disk_read = rate_of(disk_bytes, {probe.disk_read(dir, disk_bytes)});
  std::error_code ec;
  const auto where = std::filesystem::absolute(dir, ec);
  m.disk_source = "read of a " + accel::text::format_bytes(disk_bytes) + " temporary file in " + (ec ? dir : where).string() +
                  " after dropping it from the page cache";
  return m;
}

namespace detail_bandwidth {
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Writes `bytes` to a temporary file in `dir`, evicts it from the page cache, reads it back.
inline double time_disk_read(const std::filesystem::path& dir, std::uint64_t bytes) {
  std::string name = (dir / "accel-bandwidth-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0)
    throw accel::config_error("env: cannot create a temporary file in '" + dir.string() + "': " + std::strerror(errno) +
                              "; give a writable folder on the offload disk with --disk-dir");
  struct Cleanup {
    int fd;
    std::string name;
    ~Cleanup() {
      if (fd >= 0) ::close(fd);
      ::unlink(name.c_str());
    }
  } cleanup{fd, name};
  std::vector<char> chunk(8u << 20, 'a');
  for (std::uint64_t done = 0; done < bytes;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), bytes - done));
    const auto w = ::write(fd, chunk.data(), n);
    if (w <= 0) throw accel::config_error("env: cannot write the temporary file '" + name + "': " + std::strerror(errno));
    done += static_cast<std::uint64_t>(w);
  }
  ::fsync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // best effort: a cached read measures memory
  const auto t0 = std::chrono::steady_clock::now();
  for (off_t at = 0; static_cast<std::uint64_t>(at) < bytes;) {
    const auto r = ::pread(fd, chunk.data(), chunk.size(), at);
    if (r <= 0) throw accel::config_error("env: cannot read the temporary file '" + name + "': " + std::strerror(errno));
    at += r;
  }
  return seconds_since(t0);
}

// A host memory copy: the host → GPU stand-in without a GPU.
inline double time_host_copy(std::uint64_t bytes) {
  static std::vector<char> from, to;
  if (from.size() != bytes) {
    from.assign(bytes, 'a');
    to.assign(bytes, 'b');
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::memcpy(to.data(), from.data(), bytes);
  const double s = seconds_since(t0);
  if (to[bytes / 2] != 'a') throw accel::unavailable_error("env: the host copy did not happen");
  return s;
}

#if ACCEL_HAS_CUDA()
// cudaMemcpy from pinned host memory to GPU 0, synchronous.
inline std::optional<double> time_cuda_copy(std::uint64_t bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  void* host = nullptr;
  void* device = nullptr;
  if (cudaMallocHost(&host, bytes) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    if (host) cudaFreeHost(host);
    return std::nullopt;
  }
  std::memset(host, 1, bytes);
  (void)cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  const auto rc = cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
  (void)cudaDeviceSynchronize();
  const double s = seconds_since(t0);
  cudaFree(device);
  cudaFreeHost(host);
  if (rc != cudaSuccess) return std::nullopt;
  return s;
}
#endif
}  // namespace detail_bandwidth

/// The probe of this machine: cudaMemcpy from pinned memory to GPU 0 when CUDA is compiled in and
/// a GPU answers, else a host memory copy standing in for host → GPU (and saying so).
inline BandwidthProbe default_bandwidth_probe() {
  BandwidthProbe p;
  p.disk_read = detail_bandwidth::time_disk_read;
#if ACCEL_HAS_CUDA()
  if (detail_bandwidth::time_cuda_copy(1u << 20)) {
    p.host_to_device = [](std::uint64_t bytes) {
      const auto s = detail_bandwidth::time_cuda_copy(bytes);
      if (!s) throw accel::cuda_error(0, "env: cudaMemcpy from pinned memory to GPU 0 failed while measuring");
      return *s;
    };
    p.host_source = "cudaMemcpy from pinned host memory to GPU 0";
    return p;
  }
#endif
  p.host_to_device = detail_bandwidth::time_host_copy;
  p.host_source = "host memory copy (no GPU: a stand-in for host-to-GPU; a real PCIe link is usually slower)";
  return p;
}

/// $XDG_CACHE_HOME/accel/bandwidth.json, else $HOME/.cache/accel/bandwidth.json; nullopt without either.
inline std::optional<std::filesystem::path> bandwidth_cache_path(const accel::EnvSource& env) {
  if (auto x = env("XDG_CACHE_HOME"); x && !x->empty()) return std::filesystem::path(*x) / "accel" / "bandwidth.json";
  if (auto h = env("HOME"); h && !h->empty()) return std::filesystem::path(*h) / ".cache" / "accel" / "bandwidth.json";
  return std::nullopt;
}

/// The cache's JSON text.
inline std::string bandwidth_cache_json(const MeasuredBandwidths& m) {
  nlohmann::ordered_json j;
  j["host_to_device_bytes_per_second"] = m.rates.host_to_device;
  j["disk_read_bytes_per_second"] = m.rates.disk_read;
  j["host_to_device_source"] = m.host_source;
  j["disk_read_source"] = m.disk_source;
  return j.dump(2) + "\n";
}

/// Reads a cache written by bandwidth_cache_json.
/// @throws accel::config_error naming the file and what is wrong with it
inline MeasuredBandwidths parse_bandwidth_cache(const std::string& text, const std::string& file) {
  MeasuredBandwidths m;
  try {
    const auto j = nlohmann::json::parse(text);
    m.rates.host_to_device = j.at("host_to_device_bytes_per_second").get<double>();
    m.rates.disk_read = j.at("disk_read_bytes_per_second").get<double>();
    m.host_source = j.value("host_to_device_source", std::string());
    m.disk_source = j.value("disk_read_source", std::string());
  } catch (const nlohmann::json::exception& e) {
    throw accel::config_error("bandwidth cache '" + file + "' is not what accel env --measure-bandwidth writes (" + e.what() +
                              "); measure again or delete it");
  }
  if (!(m.rates.host_to_device > 0) || !(m.rates.disk_read > 0))
    throw accel::config_error("bandwidth cache '" + file + "' holds a rate that is not positive; measure again or delete it");
  return m;
}

}  // namespace accel_cli
