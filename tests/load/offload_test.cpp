// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/load/offload.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/load/dispatch.hpp>
#include <accel/load/detail/offload_writer.hpp>

#include "support/catch.hpp"
#include "support/run_command.hpp"
#include "support/safetensors_writer.hpp"

namespace fs = std::filesystem;
using accel::DType;

namespace {

std::uint32_t fnv1a(std::span<const std::byte> data) {
  std::uint32_t h = 2166136261u;
  for (auto b : data) h = (h ^ static_cast<std::uint32_t>(b)) * 16777619u;
  return h;
}

bool python_with_torch() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0;
  return ok;
}

std::string run_capture(const std::string& cmd) {
  const auto r = accel_test::run_command(cmd);
  REQUIRE(r.status == 0);
  return r.output;
}

const std::string script = std::string(ACCEL_TEST_SOURCE_DIR) + "/tests/compat/accelerate_offload.py";

using Sample = accel_test::TensorSpec;

std::vector<Sample> samples() {
  std::vector<Sample> s{{"model.embed.weight", DType::BF16, {7, 5}, {}}, {"model.layers.0.w", DType::F16, {3, 4}, {}},
                        {"model.layers.0.b", DType::F32, {9}, {}},        {"model.ids", DType::I64, {2, 3}, {}},
                        {"model.mask", DType::BOOL, {3}, {}},             {"model.scale", DType::F32, {}, {}},
                        {"model.empty", DType::F16, {0, 4}, {}}};
  for (auto& x : s) {
    x.data = accel_test::pattern_bytes(x.name, accel_test::spec_bytes(x));
    if (x.dtype == DType::BOOL)
      for (auto& b : x.data) b = static_cast<std::byte>(static_cast<unsigned>(b) & 1u);
  }
  return s;
}

// A checkpoint of float32 tensors, all placed on disk, so a dtype change sends every one through
// the offload folder. Sizes differ so a file-size limit can stop the load at the second one.
std::vector<Sample> disk_model() {
  return {{"a.w", DType::F32, {256}, {}}, {"b.w", DType::F32, {16384}, {}}, {"c.w", DType::F32, {512}, {}}};
}

accel::LoadOptions disk_options(const fs::path& folder, DType dtype) {
  accel::LoadOptions o;
  o.devices = std::vector<accel::DeviceMemoryPtr>{};
  o.dtype = dtype;
  o.offload_folder = folder;
  o.progress = false;
  return o;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const accel::DeviceMap all_on_disk = accel::DeviceMap::from_json(R"({"": "disk"})");

std::vector<std::byte> as_dtype(const Sample& s, DType to) {
  const auto raw = accel_test::pattern_bytes(s.name, accel_test::spec_bytes(s));
  const auto n = accel::shape_numel(s.shape);
  std::vector<std::byte> out(static_cast<std::size_t>(n * accel::element_size_bytes(to)));
  accel::convert_elements(s.dtype, to, raw.data(), out.data(), n);
  return out;
}

// Runs `body` in a forked child (which ends with _exit, running no destructors of the parent's
// objects) and returns its wait status.
template <class Body>
int in_child(Body&& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    try {
      code = body();
    } catch (...) {
      code = 99;
    }
    ::_exit(code);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Every entry index.json vouches for holds exactly the checkpoint's bytes in the entry's dtype.
void require_index_vouches_only_for_correct_files(const fs::path& folder) {
  accel::OffloadFolder f(folder);
  for (const auto& s : disk_model()) {
    auto it = f.index().find(s.name);
    if (it == f.index().end()) continue;
    INFO(s.name << " as " << accel::torch_name(it->second.dtype));
    auto v = f.view(s.name);
    REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == as_dtype(s, it->second.dtype));
  }
}

}  // namespace

TEST_CASE("an offload folder round-trips every tensor byte for byte, scalars with shape []", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex index;
  for (const auto& s : samples()) accel::offload_weight(dir.path(), s.name, s.dtype, s.shape, s.data, index, "src:" + s.name);
  accel::write_offload_index(dir.path(), index);
  REQUIRE(fs::file_size(dir / "model.scale.dat") == 4);
  REQUIRE(fs::file_size(dir / "model.embed.weight.dat") == 70);
  const auto j = nlohmann::json::parse(std::ifstream(dir / "index.json"));
  REQUIRE(j["model.embed.weight"]["dtype"] == "bfloat16");
  REQUIRE(j["model.embed.weight"]["shape"] == nlohmann::json::array({7, 5}));
  REQUIRE(j["model.scale"]["shape"] == nlohmann::json::array());
  REQUIRE(j["model.ids"]["dtype"] == "int64");
  accel::OffloadFolder folder(dir.path());
  for (const auto& s : samples()) {
    auto v = folder.view(s.name);
    REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == s.data);
    REQUIRE(folder.index().at(s.name).dtype == s.dtype);
    REQUIRE(folder.index().at(s.name).shape == s.shape);
  }
  // nothing but the index and the .dat files is left (no temp files)
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  REQUIRE(files == samples().size() + 1);
}

TEST_CASE("writing the index merges with an existing one, keeping old keys", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex a, b;
  const std::vector<std::byte> four(4);
  accel::offload_weight(dir.path(), "x", DType::F32, {1}, four, a);
  accel::write_offload_index(dir.path(), a);
  accel::offload_weight(dir.path(), "y", DType::I32, {1}, four, b);
  accel::write_offload_index(dir.path(), b);
  const auto idx = accel::read_offload_index(dir.path());
  REQUIRE(idx.size() == 2);
  REQUIRE(idx.at("x").dtype == DType::F32);
  REQUIRE(idx.at("y").dtype == DType::I32);
}

TEST_CASE("an entry is reused only when dtype, shape, source and file size all still match", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex index;
  const std::vector<std::byte> data(24);
  accel::offload_weight(dir.path(), "w", DType::F16, {3, 4}, data, index, "shard.safetensors@128+24");
  accel::write_offload_index(dir.path(), index);
  const auto idx = accel::read_offload_index(dir.path());
  REQUIRE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {3, 4}, "shard.safetensors@128+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::BF16, {3, 4}, "shard.safetensors@128+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {4, 3}, "shard.safetensors@128+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {3, 4}, "other@0+24"));
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "v", DType::F16, {3, 4}, ""));
  fs::resize_file(dir / "w.dat", 10);  // truncated by a crash of some other writer
  REQUIRE_FALSE(accel::offload_entry_reusable(dir.path(), idx, "w", DType::F16, {3, 4}, "shard.safetensors@128+24"));
}

TEST_CASE("a .dat file whose size disagrees with index.json is reported with both sizes", "[offload]") {
  accel_test::TempDir dir;
  accel::OffloadIndex index;
  accel::offload_weight(dir.path(), "w", DType::F32, {4}, std::vector<std::byte>(16), index);
  accel::write_offload_index(dir.path(), index);
  fs::resize_file(dir / "w.dat", 12);
  accel::OffloadFolder folder(dir.path());
  REQUIRE_THROWS_WITH(folder.view("w"), accel_test::contains("is 12 bytes but index.json says float32 [4] = 16 bytes"));
  REQUIRE_THROWS_WITH(folder.view("nope"), accel_test::contains("has no tensor 'nope' in its index.json"));
}

TEST_CASE("malformed offload indexes are rejected naming the entry", "[offload]") {
  REQUIRE_THROWS_WITH(accel::parse_offload_index("{", "i"), accel_test::contains("invalid offload index 'i': not valid JSON"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index("[]", "i"), accel_test::contains("a JSON array, not an object"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float99", "shape": []}})", "i"),
                      accel_test::contains("entry 'a' has unknown dtype \"float99\""));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float16"}})", "i"),
                      accel_test::contains("entry 'a' has no 'shape' list"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float16", "shape": [-1]}})", "i"),
                      accel_test::contains("entry 'a' has shape element -1"));
  REQUIRE_THROWS_WITH(accel::offload_file("/x", "a/b"), accel_test::contains("without '/'"));
}

TEST_CASE("a write into an unusable folder fails naming the file and the system error", "[offload]") {
  accel_test::TempDir dir;
  accel_test::write_text(dir / "not_a_folder", "x");
  accel::OffloadIndex index;
  REQUIRE_THROWS_WITH(accel::offload_weight(dir / "not_a_folder", "w", DType::F32, {1}, std::vector<std::byte>(4), index),
                      accel_test::contains("cannot create offload folder"));
  REQUIRE(index.empty());
}

TEST_CASE("a transformers-style entry is read straight from its safetensors shard", "[offload]") {
  accel_test::TempDir dir;
  accel_test::write_safetensors(dir / "model.safetensors", {{"a", DType::F16, {2, 2}, {}}, {"b", DType::F32, {3}, {}}});
  accel_test::write_text(dir / "index.json",
                         R"({"b": {"safetensors_file": "model.safetensors", "weight_name": "b", "dtype": "float32"}})");
  accel::OffloadFolder folder(dir.path());
  auto v = folder.view("b");
  REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == accel_test::pattern_bytes("b", 12));
}

TEST_CASE("accelerate's reader loads accel's offload folder and accel reads accelerate's", "[offload][python]") {
  if (!python_with_torch()) {
    WARN("/usr/bin/python3 with torch and numpy not importable: compatibility not checked");
    return;
  }
  accel_test::TempDir ours, theirs;
  accel::OffloadIndex index;
  auto all = samples();
  all.pop_back();  // numpy cannot memmap an empty file, so accelerate can neither write nor read 0-element tensors
  for (const auto& s : all) accel::offload_weight(ours.path(), s.name, s.dtype, s.shape, s.data, index, "src");
  accel::write_offload_index(ours.path(), index);
  const auto read = nlohmann::json::parse(run_capture("/usr/bin/python3 " + script + " read " + ours.path().string()));
  for (const auto& s : all) {
    INFO(s.name);
    REQUIRE(read.at(s.name)["dtype"] == std::string(accel::torch_name(s.dtype)));
    REQUIRE(read.at(s.name)["shape"] == nlohmann::json(s.shape));
    REQUIRE(read.at(s.name)["fnv"] == fnv1a(s.data));
  }
  const auto written = nlohmann::json::parse(run_capture("/usr/bin/python3 " + script + " write " + theirs.path().string()));
  accel::OffloadFolder folder(theirs.path());
  REQUIRE(folder.index().size() == written.size());
  for (const auto& [name, info] : written.items()) {
    INFO(name);
    const auto& e = folder.index().at(name);
    REQUIRE(std::string(accel::torch_name(e.dtype)) == info["dtype"].get<std::string>());
    REQUIRE(nlohmann::json(e.shape) == info["shape"]);
    REQUIRE(fnv1a(folder.view(name)) == info["fnv"].get<std::uint32_t>());
  }
}

TEST_CASE("a load killed with SIGKILL midway never leaves stale files for the rerun to reuse", "[offload][journal]") {
  accel_test::TempDir ckpt, folder;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  {
    auto m = accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::F16));
    REQUIRE(m.report().offload_written == 3);
  }
  // Same shapes in bfloat16: same file sizes, other bytes. Killed once the first file is written
  // (the second tensor has been read and converted, its file not yet written).
  const int status = in_child([&] {
    auto o = disk_options(folder.path(), DType::BF16);
    o.on_progress = [](std::uint64_t done, std::uint64_t) {
      if (done > 256 * 4) ::raise(SIGKILL);
    };
    (void)accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, o);
    return 0;
  });
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  require_index_vouches_only_for_correct_files(folder.path());

  auto m = accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::F16));
  for (const auto& s : disk_model()) {
    INFO(s.name);
    const auto v = m.at(s.name).host;
    REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == as_dtype(s, DType::F16));
  }
  // The killed bfloat16 load dropped every float16 entry before replacing any file; its one
  // finished bfloat16 file does not fit this request either.
  REQUIRE(m.report().offload_written == 3);
  REQUIRE(m.report().offload_reused == 0);
  REQUIRE_FALSE(fs::exists(folder / "index.json.journal"));
  require_index_vouches_only_for_correct_files(folder.path());
}

TEST_CASE("files a killed load finished are journaled and reused by the next load", "[offload][journal]") {
  accel_test::TempDir ckpt, folder;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  const int status = in_child([&] {
    auto o = disk_options(folder.path(), DType::BF16);
    o.on_progress = [](std::uint64_t done, std::uint64_t) {
      if (done > (256 + 16384) * 4) ::raise(SIGKILL);  // a.w and b.w written, c.w converted
    };
    (void)accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, o);
    return 0;
  });
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(fs::exists(folder / "index.json.journal"));
  REQUIRE_FALSE(fs::exists(folder / "index.json"));  // nothing folded yet: accelerate sees no entry at all
  auto m = accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::BF16));
  REQUIRE(m.report().offload_reused == 2);
  REQUIRE(m.report().offload_written == 1);
  for (const auto& s : disk_model()) {
    const auto v = m.at(s.name).host;
    REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == as_dtype(s, DType::BF16));
  }
  REQUIRE(accel::read_offload_index(folder.path()).size() == 3);
  REQUIRE_FALSE(fs::exists(folder / "index.json.journal"));
}

namespace {
// Loads disk_model() as float16 into `folder` in a child under a 16 KiB file-size limit (SIGXFSZ
// ignored or left at its default); requires the load to fail with a config_error and returns its
// message.
std::string load_under_file_size_limit(const fs::path& ckpt, const fs::path& folder, bool ignore_sigxfsz) {
  const auto message = folder.parent_path() / (folder.filename().string() + ".message");
  const int status = in_child([&] {
    if (ignore_sigxfsz) ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{16384, 16384};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      (void)accel::load_checkpoint_and_dispatch(ckpt, all_on_disk, disk_options(folder, DType::F16));
    } catch (const accel::config_error& e) {
      accel_test::write_text(message, e.what());
      return 3;
    }
    return 0;
  });
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 3);
  auto text = read_text(message);
  fs::remove(message);
  INFO(text);
  return text;
}
}  // namespace

TEST_CASE("a full disk (file-size limit) names the folder and the bytes still to write; the rerun finishes the folder",
          "[offload][journal]") {
  accel_test::TempDir ckpt, folder;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  // SIGXFSZ ignored: a write past the limit fails with EFBIG, as on a full disk.
  const auto text = load_under_file_size_limit(ckpt.path(), folder.path(), true);
  REQUIRE(text.find("offload folder '" + folder.path().string() + "' ran out of space (File too large) writing 'b.w.dat'") !=
          std::string::npos);
  REQUIRE(text.find("2 tensors of 33.00 KiB (33792 bytes) are still to be written") != std::string::npos);
  for (const auto& e : fs::directory_iterator(folder.path()))
    REQUIRE_FALSE(accel::detail::is_temporary_name(e.path().filename().string()));
  require_index_vouches_only_for_correct_files(folder.path());

  auto m = accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::F16));
  REQUIRE(m.report().offload_reused == 1);
  REQUIRE(m.report().offload_written == 2);
  for (const auto& s : disk_model()) {
    const auto v = m.at(s.name).host;
    REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == as_dtype(s, DType::F16));
  }
}

TEST_CASE("temporaries left by a killed writer are removed when the folder is opened", "[offload][journal]") {
  accel_test::TempDir ckpt, folder;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  accel_test::write_text(folder / "a.w.dat.tmp.4242", "partial");
  accel_test::write_text(folder / "index.json.tmp.77", "{");
  accel_test::write_text(folder / "notes.tmp.txt", "not ours");
  auto m = accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::F16));
  REQUIRE_FALSE(fs::exists(folder / "a.w.dat.tmp.4242"));
  REQUIRE_FALSE(fs::exists(folder / "index.json.tmp.77"));
  REQUIRE(fs::exists(folder / "notes.tmp.txt"));
  REQUIRE(m.report().warnings.size() == 1);
  REQUIRE_THAT(m.report().warnings[0], accel_test::contains("removed 2 temporary files left in offload folder"));
}

// Defect: another user of a shared offload folder plants links named as the writer's files. Before
// the fix the journal was appended through a dangling link (created at its target), temporaries
// were opened through links (the bytes landed outside, the folder kept a link), and the start-up
// cleanup skipped dangling temporaries.
TEST_CASE("links planted in an offload folder never redirect a write outside it, and the load says so", "[offload][journal]") {
  accel_test::TempDir ckpt, folder, outside;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  const std::string pid = std::to_string(::getpid());
  fs::create_symlink(outside / "journal", folder / "index.json.journal");        // dangling: an append would create it
  fs::create_symlink(outside / "a.tmp", folder / ("a.w.dat.tmp." + pid));        // the temporary this process would use
  fs::create_symlink(outside / "index.tmp", folder / ("index.json.tmp." + pid));
  fs::create_symlink(outside / "stale.tmp", folder / "c.w.dat.tmp.4242");       // a dangling temporary of another pid
  accel_test::write_text(outside / "b.target", std::string(32768, 'x'));
  fs::create_symlink(outside / "b.target", folder / "b.w.dat");                  // an existing target of the right size
  auto m = accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::F16));
  REQUIRE(m.report().offload_written == 3);
  for (const auto& s : disk_model()) {
    INFO(s.name);
    const auto v = m.at(s.name).host;
    REQUIRE(std::vector<std::byte>(v.begin(), v.end()) == as_dtype(s, DType::F16));
  }
  // Nothing was created outside, the target of the planted .dat is untouched, and the folder
  // holds regular files only.
  std::vector<std::string> outside_names;
  for (const auto& e : fs::directory_iterator(outside.path())) outside_names.push_back(e.path().filename().string());
  REQUIRE(outside_names == std::vector<std::string>{"b.target"});
  REQUIRE(read_text(outside / "b.target") == std::string(32768, 'x'));
  for (const auto& e : fs::directory_iterator(folder.path())) {
    INFO(e.path());
    REQUIRE(fs::is_regular_file(fs::symlink_status(e.path())));
  }
  REQUIRE(accel::read_offload_index(folder.path()).size() == 3);
  REQUIRE(m.report().warnings.size() == 1);
  REQUIRE_THAT(m.report().warnings[0], accel_test::contains("removed 5 symbolic links from folder '" + folder.path().string() + "' ("));
  REQUIRE_THAT(m.report().warnings[0], accel_test::contains(" and 2 more): accel never creates links there"));
}

TEST_CASE("an atomic write creates its file in the folder itself, whatever holds its temporary name", "[offload]") {
  accel_test::TempDir folder, outside;
  const std::string pid = std::to_string(::getpid());
  // What the dump (offload_weight, write_offload_index) meets: links named as its temporaries.
  fs::create_symlink(outside / "w.bin", folder / ("w.dat.tmp." + pid));
  fs::create_symlink(outside / "index.bin", folder / ("index.json.tmp." + pid));
  accel::OffloadIndex index;
  const std::vector<std::byte> four(4, std::byte{7});
  accel::offload_weight(folder.path(), "w", DType::F32, {1}, four, index);
  accel::write_offload_index(folder.path(), index);
  REQUIRE(fs::is_empty(outside.path()));
  REQUIRE(fs::is_regular_file(fs::symlink_status(folder / "w.dat")));
  REQUIRE(fs::file_size(folder / "w.dat") == 4);
  REQUIRE(accel::read_offload_index(folder.path()).size() == 1);
  REQUIRE_FALSE(fs::exists(fs::symlink_status(folder / ("w.dat.tmp." + pid))));
  // A folder (not a link) holding the temporary name cannot be removed: the write fails, nothing moves.
  fs::create_directory(folder / ("x.dat.tmp." + pid));
  REQUIRE_THROWS_WITH(accel::offload_weight(folder.path(), "x", DType::F32, {1}, four, index),
                      accel_test::contains("cannot create '" + (folder / ("x.dat.tmp." + pid)).string() + "': File exists"));
  // clean_offload_folder removes links and temporaries in the writer's names only.
  fs::create_symlink(outside / "elsewhere", folder / "notes.txt");
  fs::create_symlink(outside / "elsewhere", folder / "y.dat");
  accel_test::write_text(folder / "z.dat.tmp.99", "partial");
  const auto cleaned = accel::clean_offload_folder(folder.path());
  REQUIRE(cleaned.temporaries == 1);
  REQUIRE(cleaned.links == std::vector<std::string>{"y.dat -> " + (outside / "elsewhere").string()});
  REQUIRE(fs::is_symlink(folder / "notes.txt"));
  REQUIRE(cleaned.links_warning(folder.path()) ==
          "removed 1 symbolic link from folder '" + folder.path().string() + "' (y.dat -> " + (outside / "elsewhere").string() +
              "): accel never creates links there and does not write through them; someone else can write to this folder, "
              "so keep it private");
}

// Defect: under `ulimit -f` the first write past the limit raised SIGXFSZ, which kills (exit 153),
// leaving a temporary and a journal. Now the write is refused before it starts: a config_error.
TEST_CASE("a file-size limit without SIGXFSZ ignored is a config_error, not a kill, and leaves no temporary", "[offload][journal]") {
  accel_test::TempDir ckpt, folder;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  const auto text = load_under_file_size_limit(ckpt.path(), folder.path(), false);  // SIGXFSZ's default: termination
  REQUIRE_THAT(text, accel_test::contains("ran out of space (File too large) writing 'b.w.dat' (the file-size limit, ulimit -f, "
                                          "is 16384 bytes): 2 tensors of 33.00 KiB"));
  for (const auto& e : fs::directory_iterator(folder.path())) {
    INFO(e.path());
    REQUIRE_FALSE(accel::detail::is_temporary_name(e.path().filename().string()));
    REQUIRE(e.path().filename() != "index.json.journal");
  }
  require_index_vouches_only_for_correct_files(folder.path());
}

TEST_CASE("a second load into a folder being written fails at once instead of racing", "[offload][journal]") {
  accel_test::TempDir ckpt, folder;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  accel::detail::UniqueFd held(::open(folder.path().c_str(), O_RDONLY | O_DIRECTORY));
  REQUIRE(::flock(held.get(), LOCK_EX) == 0);
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::F16)),
                      accel_test::contains("is being written by another load"));
}

TEST_CASE("a journal line vouches only for a complete file of the recorded size", "[offload][journal]") {
  accel_test::TempDir folder;
  accel_test::write_bytes(folder / "good.dat", std::vector<std::byte>(8));
  accel_test::write_bytes(folder / "short.dat", std::vector<std::byte>(3));
  const std::string journal = R"({"good": {"dtype": "float16", "shape": [4], "accel_source": "s"}})" "\n"
                              R"({"short": {"dtype": "float16", "shape": [4]}})" "\n"
                              R"({"gone": {"dtype": "float16", "shape": [4]}})" "\n"
                              R"({"good": {"dtype": "float32", "shape": [2]}})" "\n"
                              "not json\n"
                              R"({"torn": {"dtype": "float16", "sha)";
  accel::OffloadIndex index;
  REQUIRE(accel::detail::replay_offload_journal(folder.path(), journal, index) == 2);
  REQUIRE(index.size() == 1);
  REQUIRE(index.at("good").dtype == DType::F32);  // the later line wins
}

TEST_CASE("offload indexes nested absurdly deep or with huge numbers are refused without recursion", "[offload]") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  REQUIRE_THROWS_WITH(accel::parse_offload_index(deep, "i"), accel_test::contains("nested deeper than"));
  const std::string deep_entry = R"({"a": {"dtype": "float16", "shape": )" + std::string(100000, '[') +
                                 std::string(100000, ']') + "}}";
  REQUIRE_THROWS_WITH(accel::parse_offload_index(deep_entry, "i"), accel_test::contains("nested deeper than"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float16", "shape": [1e30]}})", "i"),
                      accel_test::contains("shape element 1e+30, not a non-negative integer"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float16", "shape": [18446744073709551615]}})", "i"),
                      accel_test::contains("not a non-negative integer"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float32", "shape": [4294967296, 4294967296]}})", "i"),
                      accel_test::contains("overflows 64 bits"));
  REQUIRE_THROWS_WITH(accel::parse_offload_index(R"({"a": {"dtype": "float16", "shape": [1]}, "a": {"dtype": "float16", "shape": [2]}})", "i"),
                      accel_test::contains("duplicate key 'a'"));
}

TEST_CASE("tensor names that cannot be offload file names are refused before any byte is written", "[offload]") {
  REQUIRE(accel::offload_name_problem("model.layers.0.w") == std::nullopt);
  REQUIRE(accel::offload_name_problem(std::string("a\0b", 3)) == "it contains a NUL byte");
  REQUIRE(accel::offload_name_problem(std::string(300, 'x'))->find("300 bytes long") != std::string::npos);
  REQUIRE(accel::offload_name_problem("..") == "it is '.' or '..'");
  accel_test::TempDir ckpt, folder;
  // "w\0a" and "w\0b" are distinct tensors whose file names would both be cut to "w".
  accel_test::write_bytes(ckpt / "model.safetensors",
                          accel_test::raw_safetensors(R"({"w\u0000a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                      R"("w\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                                      std::vector<std::byte>(16)));
  REQUIRE_THROWS_WITH(accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::F16)),
                      accel_test::contains("tensor 'w\\x00a' is placed on disk and converted, but its name cannot be an offload file name: "
                                                           "it contains a NUL byte"));
  REQUIRE(fs::is_empty(folder.path()));
}

TEST_CASE("accelerate's reader loads a folder the loader wrote through its journal, after a killed run",
          "[offload][journal][python]") {
  if (!python_with_torch()) {
    WARN("/usr/bin/python3 with torch and numpy not importable: compatibility not checked");
    return;
  }
  accel_test::TempDir ckpt, folder;
  accel_test::write_safetensors(ckpt / "model.safetensors", disk_model());
  (void)in_child([&] {
    auto o = disk_options(folder.path(), DType::F16);
    o.on_progress = [](std::uint64_t done, std::uint64_t) {
      if (done > 256 * 4) ::raise(SIGKILL);
    };
    (void)accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, o);
    return 0;
  });
  (void)accel::load_checkpoint_and_dispatch(ckpt.path(), all_on_disk, disk_options(folder.path(), DType::BF16));
  const auto read = nlohmann::json::parse(run_capture("/usr/bin/python3 " + script + " read " + folder.path().string()));
  REQUIRE(read.size() == disk_model().size());
  for (const auto& s : disk_model()) {
    INFO(s.name);
    REQUIRE(read.at(s.name)["dtype"] == "bfloat16");
    REQUIRE(read.at(s.name)["shape"] == nlohmann::json(s.shape));
    REQUIRE(read.at(s.name)["fnv"] == fnv1a(as_dtype(s, DType::BF16)));
  }
}
