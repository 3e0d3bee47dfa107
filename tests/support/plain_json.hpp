// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The invariant of the DOM-free fast paths for safetensors headers and indexes: on any text, the
// fast path either declines or reads exactly what the strict parser reads (which then accepts).
// Checked by a unit test over generated and mutated texts and by the fuzz harnesses.
#pragma once

#include <accel/model/safetensors.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace accel_test {

/// What the fast path made of a header text: "declined", "agrees", or what differs.
inline std::string plain_header_verdict(std::string_view text) {
  std::map<std::string, std::string> metadata;
  auto plain = accel::detail::parse_plain_header(text, metadata);
  if (!plain) return "declined";
  auto by_name = [](std::vector<accel::TensorEntry> v) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return v;
  };
  const auto a = by_name(*plain);
  // A name given twice: parse_safetensors_header finds it in the fast path's result and sends the
  // text to the strict parser, which rejects it.
  if (std::adjacent_find(a.begin(), a.end(), [](const auto& x, const auto& y) { return x.name == y.name; }) != a.end())
    return "declined";
  accel::SafetensorsHeader strict;
  try {
    accel::detail::parse_json_header(text, "differential", strict);
  } catch (const accel::checkpoint_error& e) {
    return std::string("fast path accepted what the strict parser rejects: ") + e.what();
  }
  const auto b = by_name(strict.tensors);
  if (a.size() != b.size()) return "different tensor counts";
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape || a[i].begin != b[i].begin ||
        a[i].end != b[i].end)
      return "tensor '" + std::string(b[i].name) + "' read differently";
  if (metadata != strict.metadata) return "different metadata";
  return "agrees";
}

/// The same for an index text: the fast path declines, or the strict one reads the same entries.
inline std::string plain_index_verdict(std::string_view text) {
  std::optional<std::uint64_t> total;
  std::vector<std::pair<std::string_view, std::string_view>> entries;
  if (!accel::detail::parse_plain_index(text, total, entries)) return "declined";
  const auto strict = accel::parse_json_strict(text);
  if (!strict.error.empty() || !strict.value.is_object()) return "fast path accepted what the strict parser rejects";
  const auto& j = strict.value;
  std::optional<std::uint64_t> strict_total;
  if (auto md = j.find("metadata"); md != j.end() && md->is_object())
    if (auto ts = md->find("total_size"); ts != md->end()) strict_total = accel::json_whole_number(*ts);
  if (strict_total != total) return "different total_size";
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object() || wm->size() != entries.size()) return "different weight maps";
  std::size_t i = 0;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string() || entries[i].first != tensor || entries[i].second != shard.get<std::string>())
      return "weight_map entry '" + tensor + "' read differently";
    ++i;
  }
  return "agrees";
}

/// The same for the index summary resolve_checkpoint uses: it declines, or the strict parser reads
/// the same shards and (tensor, shard) pairs; or rejects a key given twice, which the summary
/// leaves to the comparison with the shards' headers (each holds a name once).
inline std::string index_summary_verdict(std::string_view text) {
  accel::detail::IndexSummary summary;
  if (!accel::detail::summarize_plain_index(text, summary)) return "declined";
  const auto strict = accel::parse_json_strict(text);
  if (strict.error.rfind("duplicate key", 0) == 0) return "agrees";
  if (!strict.error.empty() || !strict.value.is_object()) return "summary accepted what the strict parser rejects";
  const auto wm = strict.value.find("weight_map");
  if (wm == strict.value.end() || !wm->is_object() || wm->empty()) return "summary accepted an index without entries";
  accel::detail::PairPrint pairs;
  std::vector<std::string> shards;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) return "summary accepted a non-string shard";
    const auto& name = shard.get_ref<const std::string&>();
    pairs.add(accel::detail::name_hash(tensor), accel::detail::name_hash(name));
    if (std::find(shards.begin(), shards.end(), name) == shards.end()) shards.push_back(name);
  }
  std::sort(shards.begin(), shards.end());
  if (shards != summary.shard_names) return "different shards";
  if (!(pairs == summary.pairs)) return "different (tensor, shard) pairs";
  // resolve_checkpoint sends an unsafe shard name to the full reader, which says which; otherwise
  // the summary may not accept an index the full reader refuses (a total_size that is not a count).
  for (const auto& shard : summary.shard_names)
    if (accel::detail::unsafe_shard_name(shard)) return "agrees";
  try {
    (void)accel::parse_safetensors_index(text, "differential");
  } catch (const accel::checkpoint_error& e) {
    return std::string("summary accepted what parse_safetensors_index rejects: ") + e.what();
  }
  return "agrees";
}

}  // namespace accel_test
