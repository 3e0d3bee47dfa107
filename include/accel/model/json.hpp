// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file json.hpp
/// @brief Reading the JSON files of checkpoints and plans: whole-file reads, and parsing that
///        rejects duplicate object keys (nlohmann keeps the last silently).
#pragma once

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Outcome of parse_json_strict: the value, or what went wrong.
struct StrictJsonResult {
  nlohmann::json value;
  std::string error;  ///< empty on success; else nlohmann's message or "duplicate key 'k'"
};

namespace detail {

// SAX handler: builds the DOM like nlohmann's own parser and remembers the first duplicate key.
// (nlohmann's callback parser can do this too, but is about 20x slower.)
class StrictJsonSax : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
  using base = nlohmann::detail::json_sax_dom_parser<nlohmann::json>;
  struct Level {
    std::vector<std::string> few;         // linear scan while small
    std::unordered_set<std::string> many;  // then a hash set
  };

 public:
  explicit StrictJsonSax(nlohmann::json& result) : base(result, true) {}
  bool start_object(std::size_t n) {
    if (depth_ == open_.size()) open_.emplace_back();
    auto& level = open_[depth_++];
    level.few.clear();
    level.many.clear();
    return base::start_object(n);
  }
  bool end_object() {
    --depth_;
    return base::end_object();
  }
  bool key(string_t& k) {
    if (!duplicate_ && depth_ > 0) {
      auto& level = open_[depth_ - 1];
      bool seen = false;
      if (level.many.empty()) {
        for (const auto& x : level.few) seen = seen || x == k;
        if (!seen) {
          level.few.push_back(k);
          if (level.few.size() > 16) {
            level.many.insert(level.few.begin(), level.few.end());
            level.few.clear();
          }
        }
      } else {
        seen = !level.many.insert(k).second;
      }
      if (seen) duplicate_ = k;
    }
    return base::key(k);
  }
  [[nodiscard]] const std::optional<std::string>& duplicate() const noexcept { return duplicate_; }

 private:
  std::vector<Level> open_;
  std::size_t depth_ = 0;
  std::optional<std::string> duplicate_;
};

}  // namespace detail

/// @brief Parses `text` as JSON, rejecting invalid UTF-8, trailing garbage and duplicate keys in
///        any object.
inline StrictJsonResult parse_json_strict(std::string_view text) {
  StrictJsonResult out;
  try {
    detail::StrictJsonSax sax(out.value);
    nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
    if (sax.duplicate()) out.error = "duplicate key '" + *sax.duplicate() + "'";
  } catch (const nlohmann::json::exception& e) {
    out.error = e.what();
    out.value = nullptr;
  }
  return out;
}

/// @brief Reads a whole file as text.
/// @param what what the file is, for messages ("checkpoint index", "model skeleton")
/// @throws accel::checkpoint_error when it cannot be opened or read, naming the file and why
inline std::string read_text_file(const std::filesystem::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    detail::throw_error<checkpoint_error>("cannot open ", what, " '", path.string(), "': ", std::strerror(errno),
                                          "; check the path and its permissions");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) detail::throw_error<checkpoint_error>("cannot read ", what, " '", path.string(), "'");
  return text;
}

ACCEL_NAMESPACE_END
