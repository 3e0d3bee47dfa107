// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file offload_writer.hpp
/// @brief Loader internals: an offload folder written as a journal, so that whatever stops a load
///        (a kill, a full disk, an error) the folder's index vouches only for complete files whose
///        every recorded property matches what they hold.
///
/// The rules, in the order a load meets them:
/// 1. The folder is locked (flock on the folder itself) for the whole write; a second load into
///    it fails at once instead of racing. Every file is created relative to the folder's
///    descriptor, following no link (detail::try_write_file_at; the journal with O_NOFOLLOW), so
///    nothing is written outside the folder whatever other users of the folder planted in it.
/// 2. Symbolic links in the folder's own names (index.json, its journal, `*.dat`, temporaries)
///    are removed, and the load says so: accel never creates one, and reading or appending
///    through one would reach outside the folder. Temporaries a killed writer left
///    (`*.tmp.<pid>`, files or links) are removed; a journal it left is replayed:
///    each line vouches for one file that was complete (fdatasync, then rename) before the line
///    was appended, and is kept only when that file still has the recorded size.
/// 3. Before any byte is written, every entry about to be rewritten leaves index.json (written
///    atomically) and its old `.dat` is removed: from then on no index and no journal names a
///    file that is being replaced.
/// 4. Each tensor: temp file, fdatasync, rename, then one journal line.
/// 5. At the end the whole index is written once and the journal removed.
/// Out of space (ENOSPC, EDQUOT, or EFBIG from a file-size limit) is a config_error naming the
/// folder and the bytes still to write; the files already written stay vouched for, so the rerun
/// after space is freed writes only the rest. A file larger than the file-size limit (`ulimit -f`)
/// is refused before a byte of it is written (a write past the limit raises SIGXFSZ, which kills).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/runtime/unique_fd.hpp>
#include <accel/model/json.hpp>
#include <accel/load/offload.hpp>
#include <accel/load/detail/mapped_file.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief One tensor a load stores in the folder: its name and the entry it should have.
struct OffloadRequest {
  std::string name;
  OffloadEntry entry;  ///< dtype and shape of the stored bytes, and the source fingerprint
};

/// @brief Replays journal text over `index`: every complete line `{name: entry}` whose `.dat` in
///        `folder` has the entry's size is applied; a torn or invalid line (a killed append) is skipped.
/// @return how many lines were applied
inline std::size_t replay_offload_journal(const std::filesystem::path& folder, std::string_view journal, OffloadIndex& index) {
  std::size_t applied = 0;
  while (!journal.empty()) {
    const auto nl = journal.find('\n');
    if (nl == std::string_view::npos) break;  // no newline: the append was cut short
    const auto line = journal.substr(0, nl);
    journal.remove_prefix(nl + 1);
    try {
      const auto one = parse_offload_index(line, "journal");
      for (const auto& [name, e] : one) {
        std::error_code ec;
        const auto size = std::filesystem::file_size(offload_file(folder, name), ec);
        if (ec || size != e.size_bytes() || !e.safetensors_file.empty()) continue;
        index[name] = e;
        ++applied;
      }
    } catch (const error&) {
      // an invalid line vouches for nothing
    }
  }
  return applied;
}

/// @brief The offload folder during one load (see the file comment for the rules).
class OffloadFolderWriter {
 public:
  /// @brief Creates and locks the folder, removes stale temporaries and folds a left-over journal
  ///        into index.json.
  /// @throws accel::config_error when the folder cannot be created, is locked by another load, or
  ///         cannot be written; accel::checkpoint_error when its index.json is invalid
  explicit OffloadFolderWriter(std::filesystem::path folder) : folder_(std::move(folder)) {
    std::error_code ec;
    std::filesystem::create_directories(folder_, ec);
    if (ec)
      throw_error<config_error>("cannot create offload folder '", folder_.string(), "': ", ec.message(),
                                "; choose a writable offload folder");
    lock_ = UniqueFd(::open(folder_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (lock_.get() < 0)
      throw_error<config_error>("cannot open offload folder '", folder_.string(), "': ", std::strerror(errno));
    if (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0)
      throw_error<config_error>("offload folder '", folder_.string(), "' is being written by another load (",
                                std::strerror(errno), "); wait for it to finish or choose another offload folder");
    cleared_ = clean_offload_folder(lock_.get(), folder_);
    index_ = read_offload_index(folder_);
    const auto journal = folder_ / offload_journal_name;
    if (std::filesystem::exists(journal, ec)) {
      replay_offload_journal(folder_, read_text_file(journal, "offload journal"), index_);
      write_whole_offload_index(lock_.get(), folder_, index_);
      (void)::unlinkat(lock_.get(), offload_journal_name.data(), 0);
      sync_directory(folder_);
    }
  }
  OffloadFolderWriter(const OffloadFolderWriter&) = delete;
  OffloadFolderWriter& operator=(const OffloadFolderWriter&) = delete;
  /// @brief A writer dropped by a failed load still folds what it wrote into index.json (best
  ///        effort; the journal stays for the next load when that fails too).
  ~OffloadFolderWriter() {
    if (!finished_ && written_ > 0) {
      try {
        fold_journal();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the journal keeps the record
      }
    }
  }

  /// @brief Decides for every request whether the folder's file can be reused (index entry with
  ///        the same dtype, shape and source fingerprint, file of the right size); drops the others
  ///        from index.json and removes their old files, then checks the free space.
  /// @throws accel::config_error when the folder cannot be written or has less free space than the
  ///         bytes to write (naming both)
  void prepare(const std::vector<OffloadRequest>& requests) {
    bool dropped = false;
    std::vector<const OffloadRequest*> to_write;
    for (const auto& r : requests) {
      if (offload_entry_reusable(folder_, index_, r.name, r.entry.dtype, r.entry.shape, r.entry.source)) {
        reusable_.insert(r.name);
        continue;
      }
      dropped = index_.erase(r.name) > 0 || dropped;
      to_write.push_back(&r);
      bytes_to_write_ += r.entry.size_bytes();
      ++tensors_to_write_;
    }
    if (dropped) write_whole_offload_index(lock_.get(), folder_, index_);  // stop vouching before anything is replaced
    for (const auto* r : to_write) (void)::unlinkat(lock_.get(), offload_file(folder_, r->name).filename().c_str(), 0);
    if (!to_write.empty()) sync_directory(folder_);
    struct statvfs fs {};
    if (bytes_to_write_ > 0 && ::fstatvfs(lock_.get(), &fs) == 0) {
      // A read-only file system reports its free blocks like any other: say what is wrong.
      if (fs.f_flag & ST_RDONLY)
        throw_error<config_error>("offload folder '", folder_.string(), "' is on a read-only file system, and the load writes ",
                                  text::plural(static_cast<long long>(tensors_to_write_), "tensor"), " of ",
                                  text::format_bytes(bytes_to_write_), " into it; choose a writable offload folder");
      const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
      if (free < bytes_to_write_)
        throw_error<config_error>("offload folder '", folder_.string(), "' has ", text::format_bytes(free), " (", free,
                                  " bytes) free but the load writes ", text::plural(static_cast<long long>(tensors_to_write_), "tensor"),
                                  " of ", text::format_bytes(bytes_to_write_), " (", bytes_to_write_, " bytes) into it; free ",
                                  bytes_to_write_ - free, " bytes or choose another offload folder");
    }
  }

  /// @brief True when prepare() found `name` reusable.
  [[nodiscard]] bool reusable(const std::string& name) const { return reusable_.count(name) > 0; }

  /// @brief Writes one tensor's bytes (temp, fdatasync, rename) and journals its entry.
  /// @throws accel::config_error when the write fails; out of space names the bytes still to write
  void write(const OffloadRequest& r, std::span<const std::byte> data) {
    ACCEL_EXPECTS(data.size() == r.entry.size_bytes(), "offload write of '", r.name, "': ", data.size(),
                  " bytes given, the entry needs ", r.entry.size_bytes());
    const auto path = offload_file(folder_, r.name);
    if (auto f = try_write_file_at(lock_.get(), path.filename().string(), std::span<const std::span<const std::byte>>(&data, 1)))
      fail(*f, path);
    OffloadIndex one{{r.name, r.entry}};
    append_journal(offload_index_object(one).dump() + "\n", path);
    index_[r.name] = r.entry;
    ++written_;
    bytes_to_write_ -= std::min<std::uint64_t>(bytes_to_write_, data.size());
    --tensors_to_write_;
  }

  /// @brief Writes the whole index once, removes the journal and releases the lock; the folder
  ///        for reading when `used`.
  [[nodiscard]] std::unique_ptr<OffloadFolder> finish(bool used) && {
    if (written_ > 0) fold_journal();
    finished_ = true;
    lock_.reset();
    return used ? std::make_unique<OffloadFolder>(folder_, index_) : nullptr;
  }

  /// @brief Temporaries (`*.tmp.<pid>`) and symbolic links removed when the folder was opened.
  [[nodiscard]] const FolderCleanup& cleared() const noexcept { return cleared_; }

 private:
  [[noreturn]] void fail(const WriteFailure& f, const std::filesystem::path& path) const {
    const auto limit = file_size_limit();
    if (f.out_of_space())
      throw_error<config_error>("offload folder '", folder_.string(), "' ran out of space (", std::strerror(f.error),
                                ") writing '", path.filename().string(), "'",
                                f.error == EFBIG && limit ? concat(" (the file-size limit, ulimit -f, is ", *limit, " bytes)") : "",
                                ": ", text::plural(static_cast<long long>(tensors_to_write_), "tensor"),
                                " of ", text::format_bytes(bytes_to_write_), " (", bytes_to_write_,
                                " bytes) are still to be written; free that much space (or raise the file-size limit) "
                                "and load again: the ", written_, " tensor(s) already written are kept and reused, "
                                "or choose another offload folder");
    throw_error<config_error>("cannot ", f.step, " '", path.string(), "' in offload folder '", folder_.string(), "': ",
                              std::strerror(f.error), "; check that the offload folder is writable");
  }

  void append_journal(const std::string& line, const std::filesystem::path& path) {
    if (journal_.get() < 0) {
      // In the folder itself, never through a link (one planted since the folder was cleared: ELOOP).
      journal_ = UniqueFd(::openat(lock_.get(), offload_journal_name.data(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644));
      if (journal_.get() < 0) fail({"create", errno}, folder_ / offload_journal_name);
    }
    if (const auto limit = file_size_limit(); limit && static_cast<std::uint64_t>(current_file_size(journal_.get())) + line.size() > *limit)
      fail({"journal", EFBIG}, path);  // the append would raise SIGXFSZ
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(journal_.get(), line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      // The file is complete but unrecorded: the next load rewrites it.
      if (n <= 0) fail({"journal", n < 0 ? errno : ENOSPC}, path);
      done += static_cast<std::size_t>(n);
    }
  }

  void fold_journal() {
    write_whole_offload_index(lock_.get(), folder_, index_);
    journal_.reset();
    (void)::unlinkat(lock_.get(), offload_journal_name.data(), 0);
    sync_directory(folder_);
  }

  std::filesystem::path folder_;
  UniqueFd lock_;
  UniqueFd journal_;
  OffloadIndex index_;
  std::set<std::string> reusable_;
  std::uint64_t bytes_to_write_ = 0;
  std::size_t tensors_to_write_ = 0;
  std::size_t written_ = 0;
  FolderCleanup cleared_;
  bool finished_ = false;
};

}  // namespace detail
ACCEL_NAMESPACE_END
