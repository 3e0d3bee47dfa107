// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Checks accel's maps against transformers' for every catalogued class, without Python: for each
// class of tests/compat/fixtures/catalog_goldens.json (recorded by gen_catalog_goldens.py from
// transformers' from_pretrained) and each of its scenarios, writes the headers-only checkpoint
// (config.json, model.safetensors whose data section is a hole), runs
// `accel plan --json --device-map MODE --max-memory BUDGETS --dtype DTYPE` on it and compares,
// key by key of the model's state dict, where accel's map and transformers' put it. Also checks
// what from_pretrained checks of a map (every state-dict key has a device; no key names nothing),
// and that every class the catalog holds has a record (or the generator's reason why not).
//
//   catalog_goldens_check ACCEL [--fixture FILE] [--catalog FILE] [--only A,B] [--jobs N] [--verbose]
//   catalog_goldens_check ACCEL --fallback ...   the same maps planned with `--no-catalog` (each class's entry
//       withheld: accel's heuristics for an architecture it does not know): reports how many agree, fails
//       only on a map over budget (accel's own accounting, from --json-report)
//
// Exit 0 when every scenario is identical or listed in known_differences (with the reason) and
// still differs; 1 otherwise, naming each class, scenario and a few keys.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_command.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// (class, scenario) -> why accel's map differs from transformers' on purpose. A listed scenario
// that agrees fails the check, so the list never goes stale.
const std::string split_buffer_dropped =
    "transformers' infer_auto_device_map splits a module into its children and direct parameters, not its direct "
    "buffers: a split MaskFormerSwinSelfAttention's persistent relative_position_index gets no device, and "
    "dispatch_model's check_device_map refuses that map; accel places the buffer with its module's parts";
const std::string fp32_sized_at_16_bits =
    "the class keeps modules in float32 when loaded in float16 (keep_in_fp32_modules: T5's feed-forward `wo`, AXK2's "
    "`indexer.weights_proj`); transformers 5.25 sizes the map on the model built in float16 and upcasts them only while loading, "
    "so its blocks count 2 bytes per element of them and its fill can pass a budget; accel sizes them as loaded (4 bytes)";
const std::string fp16 = "sequential_gpu_cpu_disk_fp16_from_fp32";
const std::map<std::pair<std::string, std::string>, std::string> known_differences = {
    {{"MaskFormerModel", "auto_two_gpus_cpu_disk_bf16"}, split_buffer_dropped},
    {{"MaskFormerModel", fp16}, split_buffer_dropped},
    {{"T5ForConditionalGeneration", fp16}, fp32_sized_at_16_bits},
    {{"T5Model", fp16}, fp32_sized_at_16_bits},
    {{"Pop2PianoForConditionalGeneration", fp16}, fp32_sized_at_16_bits},
    {{"UdopModel", fp16}, fp32_sized_at_16_bits},
    {{"UdopForConditionalGeneration", fp16}, fp32_sized_at_16_bits},
    {{"AXK2ForCausalLM", fp16}, fp32_sized_at_16_bits},
    {{"Swin2SRModel", "auto_two_gpus_cpu_disk_bf16"},
     "transformers' infer_auto_device_map splits a module into its children and direct parameters, not its direct "
     "buffers: a split Swin2SRSelfAttention's non-persistent relative_coords_table and relative_position_index "
     "(33,668 bytes) are never counted; accel places and counts them with its module's parts"},
};

// Classes whose maps are still wrong, with the cause found: every failure of theirs is printed as
// OPEN rather than FAIL (this is accel's bug list, not a list of accepted differences); a class here
// that passes fails the check, so it is taken off as soon as it is fixed. Every other class must pass.
const std::map<std::string, std::string> open_problems = {};

// ---------------------------------------------------------------------------------------------
// Folded names (gen_catalog_goldens.py's fold): [template, value, ranges...], `#` a numbered part.

std::vector<long> unranges(const std::string& text) {
  std::vector<long> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto dash = part.find('-');
    const long a = std::stol(part.substr(0, dash));
    const long b = dash == std::string::npos ? a : std::stol(part.substr(dash + 1));
    for (long i = a; i <= b; ++i) out.push_back(i);
  }
  return out;
}

void expand(const std::vector<std::string>& parts, const std::vector<std::vector<long>>& numbers, std::size_t part,
            std::size_t slot, std::string name, const json& value, std::vector<std::pair<std::string, json>>& out) {
  if (part == parts.size()) {
    out.emplace_back(std::move(name), value);
    return;
  }
  const std::string dot = part == 0 ? "" : ".";
  if (parts[part] != "#") {
    expand(parts, numbers, part + 1, slot, name + dot + parts[part], value, out);
    return;
  }
  for (long n : numbers[slot]) expand(parts, numbers, part + 1, slot + 1, name + dot + std::to_string(n), value, out);
}

std::vector<std::pair<std::string, json>> unfold(const json& rows) {
  std::vector<std::pair<std::string, json>> out;
  for (const auto& row : rows) {
    const std::string t = row[0].get<std::string>();
    const json value = row.size() > 1 ? row[1] : json();
    if (t.find('#') == std::string::npos) {
      out.emplace_back(t, value);
      continue;
    }
    std::vector<std::string> parts;
    std::stringstream in(t);
    for (std::string p; std::getline(in, p, '.');) parts.push_back(p);
    for (std::size_t r = 2; r < row.size(); ++r) {
      std::vector<std::vector<long>> numbers;
      for (const auto& ranges : row[r]) numbers.push_back(unranges(ranges.get<std::string>()));
      expand(parts, numbers, 0, 0, "", value, out);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The checkpoint: a headers-only safetensors file and config.json.

std::uint64_t dtype_size(const std::string& d) {
  static const std::map<std::string, std::uint64_t> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                             {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  return sizes.at(d);
}

void write_checkpoint(const fs::path& dir, const json& config, const std::string& arch,
                      const std::vector<std::pair<std::string, json>>& tensors, const std::string& float_dtype) {
  json cfg = config;
  cfg["architectures"] = json::array({arch});
  std::ofstream(dir / "config.json") << cfg.dump();
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, value] : tensors) {
    const bool typed = value.size() == 2 && value[1].is_string();
    const json shape = typed ? value[0] : value;
    const std::string dtype = typed ? value[1].get<std::string>() : float_dtype;
    std::uint64_t n = dtype_size(dtype);
    for (const auto& d : shape) n *= d.get<std::uint64_t>();
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const fs::path file = dir / "model.safetensors";
  {
    std::ofstream out(file, std::ios::binary);
    const std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xffu));
    out << text;
  }
  fs::resize_file(file, 8 + text.size() + offset);  // the data: a hole
}

// ---------------------------------------------------------------------------------------------

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The device of `name` under a map: the longest key that is the name or a dotted prefix of it, else "".
const json* device_of(const std::string& name, const std::unordered_map<std::string, json>& map) {
  std::string key = name;
  while (true) {
    if (auto it = map.find(key); it != map.end()) return &it->second;
    if (key.empty()) return nullptr;
    const auto cut = key.rfind('.');
    key = cut == std::string::npos ? std::string() : key.substr(0, cut);
  }
}

std::string device_text(const json* d) { return d ? d->dump() : "none"; }

std::string examples(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 3; ++i) out += (i ? ", " : "") + names[i];
  return out;
}

struct Outcome {
  std::vector<std::string> failures;
  std::vector<std::string> refusals;  // --fallback: maps from_pretrained would refuse (reported, not failures)
  std::vector<std::string> lines;
  int maps = 0, maps_equal = 0, transformers_failed = 0;
  long keys = 0, keys_equal = 0;
};

Outcome check_class(const std::string& accel, const json& fixture, const json& record, const fs::path& work, bool fallback) {
  Outcome o;
  const std::string arch = record["architecture"];
  const auto tensors = unfold(record["tensors"]);
  // The state-dict keys: the checkpoint's names, less those beyond the keys, plus the keys beyond them.
  std::unordered_set<std::string> dropped;
  for (auto& [name, _] : unfold(record["checkpoint_beyond_state_dict"])) dropped.insert(name);
  std::vector<std::string> parameters;
  for (auto& [name, _] : tensors)
    if (!dropped.count(name)) parameters.push_back(name);
  for (auto& [name, _] : unfold(record["state_dict_beyond_checkpoint"])) parameters.push_back(name);
  std::unordered_set<std::string> names(parameters.begin(), parameters.end());
  for (auto& [name, _] : unfold(record["model_other_names"])) names.insert(name);
  for (const auto& p : parameters)
    for (auto cut = p.find('.'); cut != std::string::npos; cut = p.find('.', cut + 1)) names.insert(p.substr(0, cut));
  const json& config = fixture["configs"].at(record["config"].get<std::string>());
  const auto& scenarios = fixture["scenarios"];
  for (std::size_t s = 0; s < record["maps"].size(); ++s) {
    const json& golden = record["maps"][s];
    const json& scenario = scenarios.at(s);
    const std::string label = arch + " " + scenario["name"].get<std::string>();
    const fs::path dir = work / (arch + "." + std::to_string(s));
    fs::create_directories(dir);
    write_checkpoint(dir, config, arch, tensors, scenario["checkpoint_dtype"]);
    std::string cmd = quoted(accel) + " plan --checkpoint " + quoted(dir.string()) + " --json --device-map " +
                      quoted(scenario["device_map"]) + " --max-memory " + quoted(golden["max_memory"].dump());
    if (scenario["dtype"] != "auto") cmd += " --dtype " + quoted(scenario["dtype"]);
    if (fallback) cmd += " --no-catalog --json-report";
    cmd += " 2>" + quoted((dir / "stderr").string());
    const auto [status, out] = accel_test::run_command(cmd);
    std::string err;
    {
      std::ifstream in(dir / "stderr");
      err.assign(std::istreambuf_iterator<char>(in), {});
    }
    fs::remove_all(dir);
    if (status != 0) {
      o.failures.push_back(label + ": accel plan failed (exit " + std::to_string(status) + "): " + err);
      continue;
    }
    std::unordered_map<std::string, json> ours, theirs;
    try {
      const json printed = json::parse(out);
      for (auto& [k, v] : (fallback ? printed.at("device_map") : printed).items()) ours.emplace(k, v);
      if (fallback)  // the catalog withheld: the one failure is a map over budget (accel's own accounting)
        for (const auto& d : printed.at("devices"))
          if (!d.at("budget").is_null() && d.at("placed").get<std::uint64_t>() > d.at("budget").get<std::uint64_t>())
            o.failures.push_back(label + ": without the catalog accel's map puts " + d.at("placed").dump() +
                                 " bytes on " + d.at("device").dump() + ", over its budget " + d.at("budget").dump());
    } catch (const json::exception& e) {
      o.failures.push_back(label + ": accel plan printed no JSON map: " + e.what());
      continue;
    }
    const bool failed = golden.contains("transformers_error");
    if (!failed)
      for (auto& [k, v] : unfold(golden["result"])) theirs.emplace(k, v);
    std::vector<std::string> differ, uncovered, unknown;
    for (const auto& p : parameters) {
      const json *a = device_of(p, ours), *b = device_of(p, theirs);
      if (!a) uncovered.push_back(p);
      if (!failed && (!a || !b || *a != *b)) differ.push_back(p + " (accel " + device_text(a) + ", transformers " + device_text(b) + ")");
    }
    for (const auto& [k, _] : ours)
      if (!k.empty() && !names.count(k)) unknown.push_back(k);
    std::sort(unknown.begin(), unknown.end());
    auto& refusals = fallback ? o.refusals : o.failures;
    if (!uncovered.empty())
      refusals.push_back(label + ": from_pretrained would refuse accel's map: " + std::to_string(uncovered.size()) +
                           " state-dict keys have no device, e.g. " + examples(uncovered));
    if (!unknown.empty())
      refusals.push_back(label + ": from_pretrained would refuse accel's map: " + std::to_string(unknown.size()) +
                           " keys name nothing in the model, e.g. " + examples(unknown));
    if (failed) {  // transformers' own planning fails here: only accel's map is checked (above)
      ++o.transformers_failed;
      o.lines.push_back(label + ": from_pretrained fails (" + golden["transformers_error"].get<std::string>() +
                        "); accel's map covers the model");
      continue;
    }
    ++o.maps;
    o.maps_equal += differ.empty();
    o.keys += static_cast<long>(parameters.size());
    o.keys_equal += static_cast<long>(parameters.size() - differ.size());
    const auto known = known_differences.find({arch, scenario["name"].get<std::string>()});
    std::string line = label + ": " + std::to_string(parameters.size() - differ.size()) + "/" +
                       std::to_string(parameters.size()) + " state-dict keys agree";
    if (fallback) {
    } else if (known != known_differences.end()) {
      if (differ.empty()) o.failures.push_back(label + ": now agrees; remove it from known_differences");
      else line += " (known difference: " + known->second + ")";
    } else if (!differ.empty()) {
      o.failures.push_back(label + ": " + std::to_string(differ.size()) + " state-dict keys placed elsewhere, e.g. " +
                           examples(differ));
    }
    o.lines.push_back(line);
  }
  return o;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return json::parse(in);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::cerr << "usage: catalog_goldens_check ACCEL [--fixture FILE] [--catalog FILE] [--only A,B] [--jobs N] [--verbose] [--fallback]\n";
    return argc < 2 ? 2 : 0;
  }
  const std::string accel = argv[1];
  fs::path fixture_path = fs::path(ACCEL_SOURCE_DIR) / "tests/compat/fixtures/catalog_goldens.json";
  fs::path catalog_path = fs::path(ACCEL_SOURCE_DIR) / "include/accel/model/data/catalog.json";
  std::set<std::string> only;
  unsigned jobs = 2;
  bool verbose = false, fallback = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--fixture" && has_value) fixture_path = argv[++i];
    else if (a == "--catalog" && has_value) catalog_path = argv[++i];
    else if (a == "--jobs" && has_value) jobs = static_cast<unsigned>(std::max(1, std::atoi(argv[++i])));
    else if (a == "--only" && has_value) {
      std::stringstream in(argv[++i]);
      for (std::string c; std::getline(in, c, ',');) only.insert(c);
    } else if (a == "--verbose") verbose = true;
    else if (a == "--fallback") fallback = true;
    else {
      std::cerr << "catalog_goldens_check: unknown argument '" << a << "'\n";
      return 2;
    }
  }
  const json fixture = read_json(fixture_path);
  const json catalog = read_json(catalog_path);
  std::vector<std::string> failures;

  // Every catalogued class has a record or the generator's reason; the fixture is of the catalog's transformers.
  if (fixture["transformers"] != catalog["transformers"])
    failures.push_back("the fixture was recorded with transformers " + fixture["transformers"].get<std::string>() +
                       ", the catalog generated from " + catalog["transformers"].get<std::string>() +
                       ": regenerate it with tests/compat/gen_catalog_goldens.py");
  std::set<std::string> recorded;
  for (const auto& r : fixture["classes"]) recorded.insert(r["architecture"].get<std::string>());
  for (const auto& r : fixture["failed"]) {
    if (r.value("reason", std::string()).empty())
      failures.push_back(r["architecture"].get<std::string>() + ": listed as failed without a reason");
    recorded.insert(r["architecture"].get<std::string>());
  }
  std::size_t catalogued = 0;
  for (const auto& a : catalog["architectures"]) {
    ++catalogued;
    if (!recorded.count(a["architecture"].get<std::string>()))
      failures.push_back(a["architecture"].get<std::string>() + ": catalogued but has no golden record");
  }

  std::vector<const json*> records;
  for (const auto& r : fixture["classes"])
    if (only.empty() || only.count(r["architecture"].get<std::string>())) records.push_back(&r);
  char tmpl[] = "/tmp/accel-catalog-goldens-XXXXXX";
  const char* made = ::mkdtemp(tmpl);
  if (!made) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path work = made;
  std::vector<Outcome> outcomes(records.size());
  std::atomic<std::size_t> next{0};
  std::mutex print;
  auto worker = [&] {
    for (std::size_t i; (i = next++) < records.size();) {
      try {
        outcomes[i] = check_class(accel, fixture, *records[i], work, fallback);
      } catch (const std::exception& e) {
        outcomes[i].failures.push_back((*records[i])["architecture"].get<std::string>() + ": " + e.what());
      }
      if (verbose) {
        std::lock_guard lock(print);
        for (const auto& l : outcomes[i].lines) std::cout << l << "\n";
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned j = 0; j < jobs; ++j) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  fs::remove_all(work);

  int maps = 0, maps_equal = 0, transformers_failed = 0;
  long keys = 0, keys_equal = 0;
  std::size_t refused = 0;
  std::vector<std::string> open;
  for (std::size_t i = 0; i < outcomes.size() && !fallback; ++i) {
    const std::string arch = (*records[i])["architecture"].get<std::string>();
    const auto problem = open_problems.find(arch);
    if (problem == open_problems.end()) continue;
    if (outcomes[i].failures.empty())
      failures.push_back(arch + ": now passes; remove it from open_problems");
    else
      open.push_back(arch + " (" + std::to_string(outcomes[i].failures.size()) + " problems): " + problem->second);
    outcomes[i].failures.clear();
  }
  for (const auto& o : outcomes) {
    transformers_failed += o.transformers_failed;
    refused += o.refusals.size();
    if (verbose)
      for (const auto& r : o.refusals) std::cout << "note: " << r << "\n";
    maps += o.maps;
    maps_equal += o.maps_equal;
    keys += o.keys;
    keys_equal += o.keys_equal;
    failures.insert(failures.end(), o.failures.begin(), o.failures.end());
  }
  std::cout << "catalog goldens" << (fallback ? ", catalog withheld (--no-catalog; a map over budget fails)" : "") << ": " << records.size() << " classes (" << fixture["failed"].size() << " of the "
            << catalogued << " catalogued could not be recorded), " << maps_equal << "/" << maps
            << " maps agree with transformers " << fixture["transformers"].get<std::string>() << " on every key; "
            << keys_equal << "/" << keys << " state-dict keys agree; " << transformers_failed
            << " maps transformers itself fails to compute (accel's checked for coverage only)\n";
  if (fallback) std::cout << refused << " problems from_pretrained would refuse accel's map for (names without the catalog)\n";
  if (!fallback) {
    std::cout << open.size() << " classes still differ, each with the cause found (open_problems: accel's to fix)\n";
    for (const auto& o : open) std::cout << "OPEN " << o << "\n";
  }
  for (const auto& f : failures) std::cout << "FAIL " << f << "\n";
  return failures.empty() ? 0 : 1;
}
