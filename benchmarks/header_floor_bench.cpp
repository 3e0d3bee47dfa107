// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
//
// The floor under planning a sharded checkpoint: the least any planner must do before it plans.
// Reads every shard's header of a folder on the threads accel would use (mapped, or read into one
// reused buffer per thread), keeps each tensor's name, dtype, shape and offsets in flat per-shard arrays,
// and finds every name through one table over the whole folder (as a checkpoint-wide lookup and
// the duplicate check need). No validation, no index, no names, no quantization, no tree, no plan:
// `accel plan` on the same folder can only be slower, and the difference is what accel adds.
//
//   header_floor FOLDER [--threads N] [--read]
//
// Each header is mapped and the names are views of the mappings (the page cache's pages are mapped,
// not copied into fresh memory: the cheaper way on the machines measured); --read reads each into
// a buffer per thread instead, copying the names out.
//
// It reads the compact form writers produce (`{"name":{"dtype":"F8_E4M3","shape":[7168,2048],
// "data_offsets":[0,14680064]},...}`, no whitespace) and stops with exit code 2 on anything else.
// Prints the tensors, header bytes and the time from the start of main to the finished table;
// time it as a whole process (benchmarks/compare/plan_hub_names.py --floor).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <accel/model/safetensors.hpp>
#include <accel/runtime/parallel_for.hpp>
#include <accel/runtime/text.hpp>

namespace {

struct Entry {
  std::string_view name;  // of Shard::names, or of the mapped header
  accel::DType dtype = accel::DType::F32;
  std::uint32_t rank = 0;
  std::uint64_t dims[8] = {};
  std::uint64_t begin = 0, end = 0;
  std::uint64_t hash = 0;
};

struct Shard {
  std::string names;  // the names, back to back (a read header's buffer is reused)
  std::vector<Entry> entries;
};

[[noreturn]] void unexpected(const std::string& file, std::size_t at) {
  std::fprintf(stderr, "header_floor: %s: not the compact header form this floor reads (byte %zu)\n", file.c_str(), at);
  std::exit(2);
}

// The compact header form, entry by entry; `fail(at)` for anything else.
template <class Fail>
void scan(std::string_view text, bool keep_views, Shard& out, Fail&& fail) {
  const char* p = text.data();
  const char* const end = p + text.size();
  auto expect = [&](char c) {
    if (p == end || *p != c) fail(static_cast<std::size_t>(p - text.data()));
    ++p;
  };
  auto string = [&] {
    expect('"');
    const auto* q = static_cast<const char*>(std::memchr(p, '"', static_cast<std::size_t>(end - p)));
    if (!q) fail(text.size());
    const std::string_view s(p, static_cast<std::size_t>(q - p));
    p = q + 1;
    return s;
  };
  auto numbers = [&](std::uint64_t* into, std::size_t room) {
    expect('[');
    std::size_t n = 0;
    while (p != end && *p != ']') {
      if (n == room || *p < '0' || *p > '9') fail(static_cast<std::size_t>(p - text.data()));
      std::uint64_t v = 0;
      for (; p != end && *p >= '0' && *p <= '9'; ++p) v = v * 10 + static_cast<std::uint64_t>(*p - '0');
      into[n++] = v;
      if (p != end && *p == ',') ++p;
    }
    expect(']');
    return n;
  };
  out.entries.reserve(text.size() / 100 + 1);
  if (!keep_views) out.names.reserve(text.size() / 2);
  expect('{');
  while (p != end && *p == '"') {
    const auto name = string();
    expect(':');
    if (name == "__metadata__") {
      for (int depth = 0; p != end;) {
        depth += *p == '{';
        depth -= *p++ == '}';
        if (depth == 0) break;
      }
    } else {
      Entry e;
      e.hash = accel::detail::name_hash(name);
      if (keep_views) {
        e.name = name;
      } else {
        e.name = std::string_view(out.names.data() + out.names.size(), name.size());  // reserved: no reallocation
        out.names.append(name);
      }
      expect('{');
      while (p != end && *p == '"') {
        const auto field = string();
        expect(':');
        if (field == "dtype") {
          const auto dtype = accel::detail::safetensors_dtype(string());
          if (!dtype) fail(static_cast<std::size_t>(p - text.data()));
          e.dtype = *dtype;
        } else if (field == "shape") {
          e.rank = static_cast<std::uint32_t>(numbers(e.dims, 8));
        } else if (field == "data_offsets") {
          std::uint64_t off[2];
          if (numbers(off, 2) != 2) fail(static_cast<std::size_t>(p - text.data()));
          e.begin = off[0], e.end = off[1];
        } else {
          fail(static_cast<std::size_t>(p - text.data()));
        }
        if (p != end && *p == ',') ++p;
      }
      expect('}');
      out.entries.push_back(e);
    }
    if (p != end && *p == ',') ++p;
  }
  expect('}');
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  if (argc < 2 || std::string_view(argv[1]) == "--help") {
    std::printf("usage: header_floor FOLDER [--threads N] [--read]\n"
                "Reads every shard header of FOLDER into flat arrays and one name table: the floor under planning it.\n");
    return argc < 2 ? 1 : 0;
  }
  unsigned wanted = 0;
  bool map = true;
  for (int i = 2; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--read") map = false;
    else if (std::string_view(argv[i]) == "--threads" && i + 1 < argc) wanted = static_cast<unsigned>(std::stoul(argv[++i]));
  }
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[1]))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<Shard> shards(files.size());
  const unsigned threads = accel::copy_threads(wanted, files.size());
  std::vector<std::vector<char>> buffers(threads);
  std::atomic<std::uint64_t> header_bytes{0};
  accel::parallel_for(
      files.size(), threads,
      [&](std::size_t i, unsigned worker) -> std::uint64_t {
        const int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
        std::uint64_t n = 0;
        if (fd < 0 || ::pread(fd, &n, 8, 0) != 8) unexpected(files[i], 0);
        std::string_view text;
        if (map) {  // the mapping stays until the process ends: the names view it
          void* p = ::mmap(nullptr, 8 + n, PROT_READ, MAP_PRIVATE, fd, 0);
          if (p == MAP_FAILED) unexpected(files[i], 0);
          text = std::string_view(static_cast<const char*>(p) + 8, n);
        } else {
          auto& buffer = buffers[worker];
          if (buffer.size() < n) buffer.resize(n);
          if (::pread(fd, buffer.data(), n, 8) != static_cast<ssize_t>(n)) unexpected(files[i], 8);
          text = std::string_view(buffer.data(), n);
        }
        ::close(fd);
        scan(text, map, shards[i], [&](std::size_t at) { unexpected(files[i], at); });
        header_bytes += n;
        return 0;
      },
      [](std::uint64_t) {});
  // One table over the folder's names (shard, entry), as a checkpoint-wide lookup needs: the kind
  // SafetensorsHeader::name_index and Checkpoint::name_index are.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ids;
  for (std::uint32_t s = 0; s < shards.size(); ++s)
    for (std::uint32_t k = 0; k < shards[s].entries.size(); ++k) ids.emplace_back(s, k);
  accel::detail::NameIndex table;
  table.reserve(ids.size());
  const auto name_of = [&](std::uint32_t id) { return shards[ids[id].first].entries[ids[id].second].name; };
  std::uint64_t data_bytes = 0;
  for (std::uint32_t id = 0; id < ids.size(); ++id) {
    const auto& e = shards[ids[id].first].entries[ids[id].second];
    if (table.insert(e.hash, id, name_of)) {
      std::fprintf(stderr, "header_floor: tensor '%s' is stored twice\n", std::string(name_of(id)).c_str());
      return 2;
    }
    data_bytes += e.end - e.begin;
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu shards, %zu tensors, %s of headers (%s), %s of data, %u threads: %.1f ms in main\n", files.size(), ids.size(),
              accel::text::format_bytes(header_bytes.load()).c_str(), map ? "mapped" : "read", accel::text::format_bytes(data_bytes).c_str(),
              threads, ms);
  return 0;
}
