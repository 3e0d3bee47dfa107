// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file safetensors_writer.hpp
/// @brief Test-only safetensors writer: valid files, sharded checkpoints with an index, and raw
///        byte access so tests can corrupt headers on purpose.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/model/dtype.hpp>
#include <unistd.h>

namespace accel_test {

/// @brief One tensor to write. `data` empty → filled with pattern_bytes(name, size).
struct TensorSpec {
  std::string name;
  accel::DType dtype = accel::DType::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
};

/// @brief Deterministic content for a tensor: byte i = (FNV-1a(name) + i) mod 256. Loaders can
///        check what they read against it.
inline std::vector<std::byte> pattern_bytes(const std::string& name, std::uint64_t n) {
  std::uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  std::vector<std::byte> out(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((h + i) & 0xffu);
  return out;
}

/// @brief Bytes a tensor spec occupies (element count × element size; sub-byte rounded down).
inline std::uint64_t spec_bytes(const TensorSpec& t) {
  return accel::shape_numel(t.shape) * accel::bit_size(t.dtype) / 8;
}

/// @brief Assembles a file from header text and data: u64 LE length, header, data. Nothing is
///        validated, so tests can build broken files.
inline std::vector<std::byte> raw_safetensors(const std::string& header, const std::vector<std::byte>& data = {}) {
  std::vector<std::byte> out(8);
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xffu);
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

/// @brief The header JSON text for `tensors` packed contiguously in the given order.
inline std::string header_json(const std::vector<TensorSpec>& tensors,
                               const std::map<std::string, std::string>& metadata = {}) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::uint64_t size = t.data.empty() ? spec_bytes(t) : t.data.size();
    h[t.name] = {{"dtype", std::string(accel::safetensors_name(t.dtype))},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  return h.dump();
}

/// @brief A complete valid file (header space-padded to a multiple of 8, as the reference writer).
inline std::vector<std::byte> safetensors_bytes(const std::vector<TensorSpec>& tensors,
                                                const std::map<std::string, std::string>& metadata = {}) {
  std::string header = header_json(tensors, metadata);
  while ((header.size() + 8) % 8 != 0) header += ' ';
  std::vector<std::byte> data;
  for (const auto& t : tensors) {
    auto bytes = t.data.empty() ? pattern_bytes(t.name, spec_bytes(t)) : t.data;
    data.insert(data.end(), bytes.begin(), bytes.end());
  }
  return raw_safetensors(header, data);
}

/// @brief Writes bytes to a file (creating parent folders).
inline void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// @brief Writes text to a file (creating parent folders).
inline void write_text(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

/// @brief Writes one valid safetensors file.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<TensorSpec>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  write_bytes(path, safetensors_bytes(tensors, metadata));
}

/// @brief Writes `shards.size()` files `model-0000i-of-0000n.safetensors` into `dir` plus
///        `model.safetensors.index.json`; returns the index path.
inline std::filesystem::path write_sharded(const std::filesystem::path& dir,
                                           const std::vector<std::vector<TensorSpec>>& shards) {
  nlohmann::ordered_json index;
  std::uint64_t total = 0;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors(dir / name, shards[i]);
    for (const auto& t : shards[i]) {
      weight_map[t.name] = name;
      total += t.data.empty() ? spec_bytes(t) : t.data.size();
    }
  }
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  auto path = dir / "model.safetensors.index.json";
  write_text(path, index.dump(2));
  return path;
}

/// @brief A fresh folder under the system temp directory, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<unsigned> counter{0};
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("accel_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace accel_test
