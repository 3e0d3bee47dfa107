// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Greedy decoding with a Llama-architecture decoder over a checkpoint that accel placed and loaded
// across GPUs, CPU and disk: how an engine consumes a DispatchedModel.
//
// The arithmetic is plain C++ on the CPU (RMSNorm, rotary attention with grouped KV heads, SwiGLU,
// a KV cache), reading float32, bfloat16 or float16 weights as they were loaded. The weights come
// from where accel put them: resident tensors in place; offloaded layers through fetch(), with
// prefetch() of the next layer started before the current one computes, so its copy overlaps the
// computing; an input embedding left off the GPUs through read_rows(), which copies only the rows of
// the step's token ids. A tensor in real GPU memory is copied back to the host before the CPU reads
// it (an engine would run its kernels there instead).
//
// Before computing anything it checks what it is given: every config.json field it uses (type,
// range, overflow), every tensor it reads against the shape config.json implies
// (check_config_against_checkpoint), every prompt against the embedding table and the positions,
// and the --expect file's shapes. A kernel indexes weights with these numbers, so one wrong field
// would otherwise read past a weight's end or produce garbage tokens; an engine should do the same.
//
// Several prompts (--prompts FILE, or every prompt of the --expect file) run one after the other,
// each with its own KV cache. Under a launcher (accel launch --num_processes P, mpirun, torchrun...)
// the processes are replicas: each plans and loads its own copy of the model on its own devices,
// takes its contiguous share of the prompts, and the results are gathered to every process in
// prompt order; the main process prints them. Every process checks the same inputs the same way,
// so a bad prompt is refused by all of them alike, before any loads anything.
//
// With --stages S the P processes are P / S replicas of S pipeline stages (process = replica × S +
// stage): every process computes the same stage plan (plan_pipeline_load), loads only its stage
// (load_stage), and the stages of a replica work on different sequences at once, passing hidden
// states on with accel::send_async / accel::recv and the last stage's token back to the first
// (generate_pipelined). The arithmetic of one step is split accordingly (Decoder::embed, run_layers
// over a range of layers, final_norm, logits).
//
//   llama_generate --checkpoint DIR --prompt 1,17,254 --new-tokens 8
//   llama_generate --checkpoint tests/compat/fixtures/forward/llama --simulate-gpus 1MiB,1MiB
//       --max-memory 0=300KiB,1=300KiB,cpu=400KiB --expect tests/compat/fixtures/forward/llama/golden.json
//   accel launch --cpu --num_processes 2 llama_generate --checkpoint DIR --prompts prompts.txt --no-gpu
//   accel launch --cpu --num_processes 4 llama_generate --checkpoint DIR --prompts prompts.txt --no-gpu --stages 2
#include <accel/comm/collectives.hpp>
#include <accel/comm/p2p.hpp>
#include <accel/load/auto_dispatch.hpp>
#include <accel/model/json.hpp>
#include <accel/state.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

constexpr const char* usage = R"(usage: llama_generate --checkpoint DIR [options]

Greedy decoding with a Llama-architecture model (config.json + safetensors) placed and loaded by accel.

  --checkpoint DIR        the model folder (config.json, *.safetensors, index)
  --prompt IDS            one prompt's token ids, comma-separated (default: the --expect file's prompts)
  --prompts FILE          several prompts, one per line as comma-separated token ids ('1, 17, 254');
                          blank lines and lines starting with '#' are skipped
  --new-tokens N          tokens to generate per prompt, N >= 1 (default: the --expect file's count, else 8)
  --stages S              pipeline stages per replica: under a launcher of P processes, P / S replicas
                          of S stages share the prompts; each process loads only its stage (default 1:
                          every process is a replica with the whole model)
  --max-memory SPEC       budgets as accel plan takes them ('0=2GiB,1=2GiB,cpu=8GiB'); default: measured
  --simulate-gpus SIZES   host-simulated GPUs of these sizes ('1MiB,1MiB') instead of CUDA
  --no-gpu                no GPU at all, even where CUDA has some: CPU and disk only
  --device-map MODE       auto | balanced | balanced_low_0 | sequential (default auto)
  --objective fit|speed   fit: transformers' map (default); speed: the fewest weight bytes streamed
                          per forward pass within the same budgets
  --dtype DTYPE           load dtype of floating tensors: float32, bfloat16, float16 (default: config.json's)
  --offload-folder DIR    where converted disk tensors go (needed when --dtype changes a disk tensor)
  --copy-back             read every device tensor through a copy to the host, as with a real GPU (with
                          --stages, also pass the stages' messages through a GPU buffer)
  --expect FILE           golden.json from tests/compat/gen_forward.py: exit 1 unless every prompt's
                          tokens are identical and every step's logits are within --tolerance (relative
                          to the step's largest logit); without --prompt/--prompts, all its prompts run
  --tolerance X           a finite number >= 0 (default 1e-3)
  --quiet                 print only the tokens and the check
  --help                  this text

Under a launcher (accel launch --num_processes P [--cpu | --gpus_per_process K], mpirun, torchrun,
srun), each process loads its own copy on its own GPUs (with --simulate-gpus, its own simulated
ones) and generates for its share of the prompts; the main process prints every prompt's line in
prompt order. With --stages S, process p is stage p % S of replica p / S: the stages of a replica
work on different prompts at once, hidden states passing from stage to stage, and the report shows
each process's share of the weights and how busy it was. Without --max-memory the stages are
planned under the budgets the main process measures. Every process must be given the same prompts,
new tokens, stages and checkpoint (with --stages, also budgets, device map, objective and dtype):
the processes compare them before any loads and all stop with status 2 on a difference.

Exit status (docs/exit-codes.md): 0 done (and matched --expect); 1 differs from --expect; 2 bad
command line (an option's value, a --prompts file, a prompt outside the vocabulary or the positions,
--stages that does not divide the processes or exceeds the model's parts, processes given different
inputs); 3 a bad --expect file, or bad budgets; 4 what this example does not implement (another
architecture, a quantized weight, rope scaling); 5 no placement fits the budgets; 6 a bad
config.json or checkpoint, one that contradicts the other, or weights whose logits are not finite;
7 a collective failed (another process died); 70 a bug.
)";

// ---------------------------------------------------------------------------------------------
// Refusals. Each kind of problem throws the accel error of its category, so that main() exits
// with the code docs/exit-codes.md gives that category.

template <class Error, class... Parts>
[[noreturn]] void refuse(const Parts&... parts) {
  std::ostringstream out;
  out << "llama_generate: ";
  (out << ... << parts);
  throw Error(out.str());
}
// The command line (exit 2).
template <class... Parts>
[[noreturn]] void bad_usage(const Parts&... parts) { refuse<accel::usage_error>(parts...); }
// The --expect file (exit 3).
template <class... Parts>
[[noreturn]] void bad_golden(const Parts&... parts) { refuse<accel::config_error>("the --expect file: ", parts...); }
// What this example does not implement (exit 4).
template <class... Parts>
[[noreturn]] void not_implemented(const Parts&... parts) { refuse<accel::unavailable_error>(parts...); }
// config.json, the checkpoint, or a contradiction between them (exit 6).
template <class... Parts>
[[noreturn]] void bad_checkpoint(const Parts&... parts) { refuse<accel::checkpoint_error>(parts...); }

// The exit status of an accel error: docs/exit-codes.md's table for the accel command.
int exit_code_for(const accel::error& e) {
  static const std::map<std::string, int, std::less<>> codes = {
      {"usage", 2},  {"config", 3},       {"unavailable", 4}, {"planning", 5}, {"checkpoint", 6},
      {"comm", 7},   {"comm.timeout", 7}, {"nccl", 7},        {"launch", 8},   {"cuda", 9}};
  const auto it = codes.find(e.category());
  return it == codes.end() ? 70 : it->second;
}

// a × b, or nullopt when it does not fit in 64 bits: config.json can hold any number.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// ---------------------------------------------------------------------------------------------
// The command line

struct Args {
  std::string checkpoint;
  std::vector<std::int64_t> prompt;
  std::optional<std::string> prompts_file;
  std::optional<std::size_t> new_tokens;
  std::size_t stages = 1;
  std::optional<std::string> max_memory, simulate_gpus, dtype, offload_folder, expect;
  std::string device_map = "auto";
  accel::PlanObjective objective = accel::PlanObjective::fit;
  double tolerance = 1e-3;
  bool copy_back = false, quiet = false, no_gpu = false;
};

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::string piece;
  std::istringstream in{std::string(text)};
  while (std::getline(in, piece, sep))
    if (!piece.empty()) out.push_back(piece);
  return out;
}

// All of `text` as a whole number in [lo, hi]. (std::stoll would take "12abc" as 12 and say only
// "stoll" about "x".)
std::optional<std::int64_t> whole_number(std::string_view text, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

std::vector<std::int64_t> parse_token_ids(std::string_view value) {
  if (value.empty()) bad_usage("--prompt is empty; give the prompt's token ids separated by commas, like 1,17,254");
  std::vector<std::int64_t> ids;
  for (std::size_t begin = 0;;) {
    const std::size_t comma = std::min(value.find(',', begin), value.size());
    const std::string_view piece = value.substr(begin, comma - begin);
    const auto id = whole_number(piece, 0, std::numeric_limits<std::int64_t>::max());
    if (!id)
      bad_usage("--prompt takes token ids separated by commas, like 1,17,254; '", piece, "' in '", value,
                "' is not a whole number >= 0");
    ids.push_back(*id);
    if (comma == value.size()) return ids;
    begin = comma + 1;
  }
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view opt = argv[i];
    if (opt == "--help" || opt == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (opt == "--copy-back") { a.copy_back = true; continue; }
    if (opt == "--quiet") { a.quiet = true; continue; }
    if (opt == "--no-gpu") { a.no_gpu = true; continue; }
    if (i + 1 >= argc) bad_usage(opt, " needs a value (see --help)");
    const std::string value = argv[++i];
    if (opt == "--checkpoint") a.checkpoint = value;
    else if (opt == "--prompt") a.prompt = parse_token_ids(value);
    else if (opt == "--prompts") a.prompts_file = value;
    else if (opt == "--stages") {
      const auto n = whole_number(value, 1, std::numeric_limits<std::int32_t>::max());
      if (!n) bad_usage("--stages takes how many pipeline stages each replica has, a whole number >= 1; got '", value, "'");
      a.stages = static_cast<std::size_t>(*n);
    } else if (opt == "--new-tokens") {
      const auto n = whole_number(value, 1, std::numeric_limits<std::int32_t>::max());
      if (!n) bad_usage("--new-tokens takes how many tokens to generate, a whole number >= 1; got '", value, "'");
      a.new_tokens = static_cast<std::size_t>(*n);
    } else if (opt == "--max-memory") a.max_memory = value;
    else if (opt == "--simulate-gpus") a.simulate_gpus = value;
    else if (opt == "--device-map") a.device_map = value;
    else if (opt == "--objective") a.objective = accel::parse_plan_objective(value);
    else if (opt == "--dtype") {
      if (value != "float32" && value != "bfloat16" && value != "float16")
        bad_usage("--dtype takes float32, bfloat16 or float16 (the dtypes this example computes with); got '", value, "'");
      a.dtype = value;
    } else if (opt == "--offload-folder") a.offload_folder = value;
    else if (opt == "--expect") a.expect = value;
    else if (opt == "--tolerance") {
      // from_chars also reads "nan" and "inf": a NaN tolerance would make every comparison pass.
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), a.tolerance);
      if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(a.tolerance) || a.tolerance < 0)
        bad_usage("--tolerance takes a finite number >= 0, like 1e-3; got '", value, "'");
    } else bad_usage("unknown option '", opt, "' (see --help)");
  }
  if (a.checkpoint.empty()) bad_usage("--checkpoint DIR is required (see --help)");
  if (!a.prompt.empty() && a.prompts_file) bad_usage("give --prompt or --prompts FILE, not both");
  return a;
}

// ---------------------------------------------------------------------------------------------
// Reading JSON files. accel::read_text_file opens without blocking and reads only a regular file
// of bounded size (a FIFO named config.json would otherwise wait forever for a writer, /dev/zero
// would never end); parse_json_strict also refuses duplicate keys, which would let one config.json
// say two things. Both throw checkpoint_error naming the file.
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view what) {
  auto parsed = accel::parse_json_strict(accel::read_text_file(path, what));
  if (!parsed.error.empty()) bad_checkpoint(what, " '", path.string(), "' is not valid JSON: ", parsed.error);
  if (!parsed.value.is_object()) bad_checkpoint(what, " '", path.string(), "' is not a JSON object");
  return std::move(parsed.value);
}

// The text of a file the command line names: refused as a command-line error (exit 2), not as a
// checkpoint's (read_text_file's category), with the same message.
std::string read_option_file(const std::filesystem::path& path, std::string_view what) {
  try {
    return accel::read_text_file(path, what);
  } catch (const accel::checkpoint_error& e) {
    const std::string_view message = e.what();
    bad_usage(message.substr(message.find("] ") + 2));
  }
}

// ---------------------------------------------------------------------------------------------
// The prompts

// One prompt to run, and how messages name it.
struct Prompt {
  std::vector<std::int64_t> ids;
  std::string name;  // "the prompt", "prompt 2 (prompts.txt line 4)", "prompt 1 (the --expect file's prompts[1])"
  bool from_golden = false;
};

std::string_view trimmed(std::string_view s) {
  constexpr std::string_view blanks = " \t\r";
  const auto first = s.find_first_not_of(blanks);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(blanks) - first + 1);
}

// --prompts FILE: one prompt per line, its token ids separated by commas, spaces around an id
// allowed ("1, 17, 254"). Blank lines and lines whose first non-blank character is '#' are skipped,
// so a file can carry comments; anything else that is not a list of ids is refused naming the line.
std::vector<Prompt> read_prompts_file(const std::string& path) {
  const std::string text = read_option_file(path, "--prompts file");
  std::vector<Prompt> prompts;
  std::size_t line_number = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    const std::string_view line = trimmed(std::string_view(text).substr(begin, end - begin));
    begin = end + 1;
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    std::vector<std::int64_t> ids;
    for (std::size_t from = 0;;) {
      const std::size_t comma = std::min(line.find(',', from), line.size());
      const std::string_view piece = trimmed(line.substr(from, comma - from));
      const auto id = whole_number(piece, 0, std::numeric_limits<std::int64_t>::max());
      if (!id)
        bad_usage("--prompts file '", path, "' line ", line_number, ": '", piece, "' is not a token id (a whole number >= 0); ",
                  "write one prompt per line as token ids separated by commas, like 1,17,254 (lines starting with # are comments)");
      ids.push_back(*id);
      if (comma == line.size()) break;
      from = comma + 1;
    }
    prompts.push_back({std::move(ids), "prompt " + std::to_string(prompts.size()) + " (" + path + " line " + std::to_string(line_number) + ")"});
  }
  if (prompts.empty())
    bad_usage("--prompts file '", path, "' holds no prompt; write one per line as token ids separated by commas, like 1,17,254 ",
              "(blank lines and lines starting with # are skipped)");
  return prompts;
}

// ---------------------------------------------------------------------------------------------
// config.json, read field by field: each refusal names the field and its value (nlohmann's own
// conversions would say "type must be number, but is string" without saying which field).

// `key` of `object` when present and not null (transformers reads null as "the default"), else nullptr.
const nlohmann::json* field(const nlohmann::json& object, const std::string& key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void bad_field(std::string_view name, const nlohmann::json& value, std::string_view want) {
  bad_checkpoint("config.json's ", name, " is ", accel::json_excerpt(value), ", not ", want,
                 "; fix config.json (use the one the weights were saved with)");
}

// A size or a count: a whole number >= 1 that fits in 64 bits (zero heads would divide by zero,
// a zero size would make weights without elements). Without the field: `fallback`, else refused.
std::size_t positive_count(const nlohmann::json& j, const std::string& key, std::optional<std::size_t> fallback = std::nullopt) {
  const nlohmann::json* v = field(j, key);
  if (!v) {
    if (fallback) return *fallback;
    bad_checkpoint("config.json has no ", key, "; a Llama config.json gives it");
  }
  const auto n = accel::json_whole_number(*v);
  if (!n || *n == 0 || *n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    bad_field(key, *v, "a whole number >= 1");
  return static_cast<std::size_t>(*n);
}

// A finite number (JSON cannot write NaN, but 1e999 reads as infinity).
double finite_number(const nlohmann::json& j, const std::string& key, std::string_view name, double fallback) {
  const nlohmann::json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_number() || !std::isfinite(v->get<double>())) bad_field(name, *v, "a finite number");
  return v->get<double>();
}

bool flag(const nlohmann::json& j, const std::string& key, bool fallback) {
  const nlohmann::json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad_field(key, *v, "true or false");
  return v->get<bool>();
}

std::string text(const nlohmann::json& j, const std::string& key, std::string_view name, const std::string& fallback) {
  const nlohmann::json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_string()) bad_field(name, *v, "a string");
  return v->get<std::string>();
}

// What the decoder needs from config.json, each value checked on its own here and against the
// tensors by check_config_against_checkpoint. Anything it does not implement is refused by name.
struct LlamaConfig {
  std::size_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  std::size_t max_positions = 0;
  std::size_t q_dim = 0, kv_dim = 0;  // heads × head_dim and kv_heads × head_dim, without overflow
  double eps = 1e-6, rope_theta = 10000;
  bool tied = false;

  static LlamaConfig from_json(const nlohmann::json& j) {
    const nlohmann::json* arch = field(j, "architectures");
    if (arch && (!arch->is_array() || (!arch->empty() && !(*arch)[0].is_string())))
      bad_field("architectures", *arch, "a list of class names");
    if (!arch || arch->empty() || (*arch)[0] != "LlamaForCausalLM")
      not_implemented("config.json's architecture is ", arch && !arch->empty() ? (*arch)[0].dump() : std::string("missing"),
                      "; this example implements LlamaForCausalLM only");
    LlamaConfig c;
    c.hidden = positive_count(j, "hidden_size");
    c.intermediate = positive_count(j, "intermediate_size");
    c.layers = positive_count(j, "num_hidden_layers");
    c.heads = positive_count(j, "num_attention_heads");
    c.kv_heads = positive_count(j, "num_key_value_heads", c.heads);
    c.vocab = positive_count(j, "vocab_size");
    c.max_positions = positive_count(j, "max_position_embeddings", 2048);  // LlamaConfig's default
    // Without head_dim, transformers takes hidden_size // num_attention_heads.
    if (!field(j, "head_dim") && c.hidden / c.heads == 0)
      bad_checkpoint("config.json has no head_dim and hidden_size / num_attention_heads (", c.hidden, " / ", c.heads,
                     ") is 0; give head_dim or fix these fields");
    c.head_dim = positive_count(j, "head_dim", c.hidden / c.heads);
    if (c.heads % c.kv_heads != 0)
      bad_checkpoint("config.json's num_attention_heads (", c.heads, ") is not a multiple of num_key_value_heads (", c.kv_heads,
                     "): grouped attention shares each key/value head among a whole number of query heads");
    if (c.head_dim % 2 != 0)
      bad_checkpoint("config.json's head_dim is ", c.head_dim, ", odd: the rotary embedding rotates pairs of dimensions");
    const auto q_dim = checked_mul(c.heads, c.head_dim), kv_dim = checked_mul(c.kv_heads, c.head_dim);
    if (!q_dim || !kv_dim)
      bad_checkpoint("config.json's num_attention_heads × head_dim (", c.heads, " × ", c.head_dim,
                     ") overflows 64 bits; fix config.json (use the one the weights were saved with)");
    c.q_dim = static_cast<std::size_t>(*q_dim);
    c.kv_dim = static_cast<std::size_t>(*kv_dim);

    c.eps = finite_number(j, "rms_norm_eps", "rms_norm_eps", 1e-6);
    if (c.eps < 0) bad_field("rms_norm_eps", j.at("rms_norm_eps"), "a number >= 0");
    c.tied = flag(j, "tie_word_embeddings", false);  // LlamaConfig's default

    // Rotary settings: transformers 5 writes rope_parameters, older versions rope_theta beside it.
    const nlohmann::json* rope = field(j, "rope_parameters");
    if (rope && !rope->is_object()) bad_field("rope_parameters", *rope, "an object");
    const nlohmann::json no_rope = nlohmann::json::object();
    const nlohmann::json& rp = rope ? *rope : no_rope;
    const bool nested = field(rp, "rope_theta") != nullptr;
    const std::string theta_name = nested ? "rope_parameters.rope_theta" : "rope_theta";
    c.rope_theta = finite_number(nested ? rp : j, "rope_theta", theta_name, 10000.0);
    // theta is the base of the frequencies 1 / theta^(2i/d): 0 or less gives infinite or NaN angles.
    if (c.rope_theta <= 0) bad_field(theta_name, (nested ? rp : j).at("rope_theta"), "a number > 0");
    const std::string rope_type = text(rp, "rope_type", "rope_parameters.rope_type", "default");
    if (rope_type != "default") not_implemented("rope_type '", rope_type, "' is not implemented (default only)");
    if (field(j, "rope_scaling")) not_implemented("rope_scaling is not implemented");
    if (text(j, "hidden_act", "hidden_act", "silu") != "silu") not_implemented("hidden_act must be silu");
    if (flag(j, "attention_bias", false) || flag(j, "mlp_bias", false)) not_implemented("attention/MLP biases are not implemented");
    return c;
  }
};

// ---------------------------------------------------------------------------------------------
// config.json against the checkpoint

// One dimension a weight must have: its value and the config.json fields it comes from.
struct Dim {
  std::size_t value;
  std::string fields;  // "hidden_size", or "num_attention_heads × head_dim (4 × 32)"
};

bool computes_with(accel::DType d) { return d == accel::DType::F32 || d == accel::DType::BF16 || d == accel::DType::F16; }

// The checkpoint's tensor `name` must be there (`why`: what says so), be a dtype this example
// computes with, and have exactly the shape config.json implies.
void check_tensor(const accel::Checkpoint& checkpoint, const std::string& name, const std::vector<Dim>& dims, std::string_view why) {
  const accel::TensorLocation* where = checkpoint.find(name);
  if (!where)
    bad_checkpoint("the checkpoint has no tensor '", name, "' although ", why,
                   "; use the config.json the weights were saved with");
  const accel::TensorEntry& t = checkpoint.entry(*where);
  if (!computes_with(t.dtype))
    not_implemented("'", name, "' is ", accel::torch_name(t.dtype), "; this example reads float32, bfloat16 and float16");
  std::string implied = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) implied += (i ? ", " : "") + dims[i].fields;
  implied += "]";
  if (t.shape.size() != dims.size())
    bad_checkpoint("'", name, "' has shape ", shape_text(t.shape), " but config.json implies ", implied,
                   "; use the config.json the weights were saved with");
  for (std::size_t i = 0; i < dims.size(); ++i)
    if (static_cast<std::uint64_t>(t.shape[i]) != dims[i].value)
      bad_checkpoint("config.json's ", dims[i].fields, " is ", dims[i].value, " but dimension ", i, " of '", name,
                     "' (shape ", shape_text(t.shape), ", expected ", implied, ") is ", t.shape[i],
                     "; config.json does not describe these weights: use the config.json they were saved with");
}

// Everything the decoder indexes with config.json's numbers, checked against the tensors really in
// the checkpoint before anything is planned, loaded or computed: a hidden_size or vocab_size that
// disagrees with the weights would make the arithmetic read past a weight's end (a crash, or heap
// corruption) or compute garbage tokens without a word. Every tensor the decoder reads is checked:
// the embedding, each layer's attention and MLP projections and norms, the final norm and the
// head. (These are checkpoint names; for Llama they are the model's names the decoder uses too.)
void check_config_against_checkpoint(const LlamaConfig& c, const accel::Checkpoint& checkpoint) {
  const Dim hidden{c.hidden, "hidden_size"}, inter{c.intermediate, "intermediate_size"}, vocab{c.vocab, "vocab_size"};
  const Dim q{c.q_dim, "num_attention_heads × head_dim (" + std::to_string(c.heads) + " × " + std::to_string(c.head_dim) + ")"};
  const Dim kv{c.kv_dim, "num_key_value_heads × head_dim (" + std::to_string(c.kv_heads) + " × " + std::to_string(c.head_dim) + ")"};
  check_tensor(checkpoint, "model.embed_tokens.weight", {vocab, hidden}, "every Llama has an input embedding");
  const std::string per_layer = "config.json's num_hidden_layers is " + std::to_string(c.layers);
  for (std::size_t l = 0; l < c.layers; ++l) {  // stops at the first missing layer, however large the count
    const std::string p = "model.layers." + std::to_string(l) + ".";
    check_tensor(checkpoint, p + "self_attn.q_proj.weight", {q, hidden}, per_layer);
    check_tensor(checkpoint, p + "self_attn.k_proj.weight", {kv, hidden}, per_layer);
    check_tensor(checkpoint, p + "self_attn.v_proj.weight", {kv, hidden}, per_layer);
    check_tensor(checkpoint, p + "self_attn.o_proj.weight", {hidden, q}, per_layer);
    check_tensor(checkpoint, p + "mlp.gate_proj.weight", {inter, hidden}, per_layer);
    check_tensor(checkpoint, p + "mlp.up_proj.weight", {inter, hidden}, per_layer);
    check_tensor(checkpoint, p + "mlp.down_proj.weight", {hidden, inter}, per_layer);
    check_tensor(checkpoint, p + "input_layernorm.weight", {hidden}, per_layer);
    check_tensor(checkpoint, p + "post_attention_layernorm.weight", {hidden}, per_layer);
  }
  // A layer past num_hidden_layers would be loaded but never run: the config is for another model.
  constexpr std::string_view layers_prefix = "model.layers.";
  for (const std::string_view name : checkpoint.tensor_names) {
    if (!name.starts_with(layers_prefix)) continue;
    const std::string_view rest = name.substr(layers_prefix.size());
    const auto layer = whole_number(rest.substr(0, rest.find('.')), 0, std::numeric_limits<std::int64_t>::max());
    if (layer && static_cast<std::uint64_t>(*layer) >= c.layers)
      bad_checkpoint("the checkpoint has '", name, "' but config.json's num_hidden_layers is ", c.layers,
                     "; use the config.json the weights were saved with");
  }
  check_tensor(checkpoint, "model.norm.weight", {hidden}, "every Llama has a final norm");
  // The head: lm_head, or with tied embeddings the input embedding (checked above). A stored
  // lm_head is checked either way.
  if (!c.tied || checkpoint.find("lm_head.weight"))
    check_tensor(checkpoint, "lm_head.weight", {vocab, hidden}, "config.json's tie_word_embeddings is false");
}

// ---------------------------------------------------------------------------------------------
// The --expect file

// golden.json from tests/compat/gen_forward.py: for each of its prompts, transformers' greedy
// tokens and, per generated step, the last position's logits.
struct GoldenRun {
  std::vector<std::int64_t> prompt, tokens;
  std::vector<std::vector<float>> logits;  // [step][vocabulary]
};
struct Golden {
  std::size_t new_tokens = 0;  // steps per prompt
  std::vector<GoldenRun> runs;
};

constexpr const char* regenerate = " (regenerate it with tests/compat/gen_forward.py)";

std::vector<std::int64_t> golden_ids(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json* v = field(j, key);
  if (!v || !v->is_array() || v->empty())
    bad_golden(where, " is ", v ? accel::json_excerpt(*v) : std::string("missing"), ", not a non-empty list of token ids", regenerate);
  std::vector<std::int64_t> ids;
  for (const auto& id : *v) {
    const auto n = accel::json_whole_number(id);
    if (!n || *n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      bad_golden(where, " holds ", accel::json_excerpt(id), ", not a token id (a whole number >= 0)");
    ids.push_back(static_cast<std::int64_t>(*n));
  }
  return ids;
}

// One entry of "prompts": its parts must agree with each other and with the file's step count.
GoldenRun read_golden_run(const nlohmann::json& j, const std::string& where, std::size_t steps, std::size_t vocab_hint) {
  if (!j.is_object()) bad_golden(where, " is ", accel::json_excerpt(j, 40), ", not an object with prompt, tokens and logits", regenerate);
  GoldenRun g;
  g.prompt = golden_ids(j, "prompt", where + ".prompt");
  g.tokens = golden_ids(j, "tokens", where + ".tokens");
  if (g.tokens.size() != steps)
    bad_golden(where, ".tokens holds ", g.tokens.size(), " tokens but new_tokens is ", steps, regenerate);
  const nlohmann::json* logits = field(j, "logits");
  if (!logits || !logits->is_array() || logits->empty())
    bad_golden(where, ".logits is ", logits ? accel::json_excerpt(*logits, 40) : std::string("missing"), ", not a list of ", steps,
               " steps' logits, one per token; a check that compares nothing cannot pass", regenerate);
  if (logits->size() != steps)
    bad_golden(where, ".logits has ", logits->size(), " steps but ", where, ".tokens has ", steps,
               "; each generated token needs its step's logits", regenerate);
  for (std::size_t s = 0; s < logits->size(); ++s) {
    const nlohmann::json& row = (*logits)[s];
    const std::size_t want = s > 0 ? g.logits[0].size() : vocab_hint;
    if (!row.is_array() || row.empty() || (want && row.size() != want))
      bad_golden(where, ".logits[", s, "] is ", accel::json_excerpt(row, 40), ", not a list of ",
                 want ? std::to_string(want) + " numbers like the first step's" : std::string("numbers"));
    auto& out = g.logits.emplace_back();
    for (const auto& x : row) {
      if (!x.is_number() || !std::isfinite(x.get<double>()))
        bad_golden(where, ".logits[", s, "] holds ", accel::json_excerpt(x), ", not a finite number");
      out.push_back(x.get<float>());
    }
  }
  return g;
}

// Reads the file and checks its parts agree with each other: a check with nothing to compare (no
// prompts, no logits, no tokens) would pass any model, so each part must be there and one step
// long per token, and every step as long as the first.
Golden read_golden(const std::filesystem::path& path) {
  nlohmann::json j;
  try {
    j = read_json_file(path, "--expect file");
  } catch (const accel::checkpoint_error& e) {  // the file is a bad input of the check: exit 3, not 6
    const std::string_view what = e.what();
    throw accel::config_error(std::string(what.substr(what.find("] ") + 2)));
  }
  Golden g;
  const nlohmann::json* steps = field(j, "new_tokens");
  const auto count = steps ? accel::json_whole_number(*steps) : std::nullopt;
  if (!count || *count == 0 || *count > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
    bad_golden("new_tokens is ", steps ? accel::json_excerpt(*steps) : std::string("missing"), ", not a whole number >= 1", regenerate);
  g.new_tokens = static_cast<std::size_t>(*count);
  const nlohmann::json* runs = field(j, "prompts");
  if (!runs || !runs->is_array() || runs->empty())
    bad_golden("prompts is ", runs ? accel::json_excerpt(*runs, 40) : std::string("missing"),
               ", not a non-empty list of prompts with their tokens and logits", regenerate);
  for (std::size_t i = 0; i < runs->size(); ++i)
    g.runs.push_back(read_golden_run((*runs)[i], "prompts[" + std::to_string(i) + "]", g.new_tokens,
                                     g.runs.empty() ? 0 : g.runs[0].logits[0].size()));
  return g;
}

// The file against the model: a logit per id of the vocabulary, tokens inside it, and at least as
// many steps as asked for.
void check_golden_against_model(const Golden& g, std::size_t vocab, std::size_t new_tokens) {
  if (g.runs[0].logits[0].size() != vocab)
    bad_golden("its logits have ", g.runs[0].logits[0].size(), " entries per step but the model's vocabulary has ", vocab,
               " ids; it was made for another model");
  for (std::size_t i = 0; i < g.runs.size(); ++i)
    for (std::size_t s = 0; s < g.runs[i].tokens.size(); ++s)
      if (static_cast<std::uint64_t>(g.runs[i].tokens[s]) >= vocab)
        bad_golden("prompts[", i, "].tokens[", s, "] is ", g.runs[i].tokens[s], ", outside the model's vocabulary of ", vocab,
                   " ids; it was made for another model");
  if (new_tokens > g.new_tokens)
    bad_usage("--new-tokens ", new_tokens, " asks for more steps than the --expect file's ", g.new_tokens, "; give at most ", g.new_tokens);
}

std::string join(const std::vector<std::int64_t>& ids) {
  std::string out;
  for (auto id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

// What to run: --prompts FILE's prompts, --prompt's, or else every prompt of the --expect file.
std::vector<Prompt> prompts_to_run(const Args& args, const std::optional<Golden>& golden) {
  if (args.prompts_file) return read_prompts_file(*args.prompts_file);
  if (!args.prompt.empty()) return {{args.prompt, "the prompt"}};
  if (!golden) bad_usage("give --prompt, --prompts FILE, or --expect with a golden file (see --help)");
  std::vector<Prompt> out;
  for (std::size_t i = 0; i < golden->runs.size(); ++i)
    out.push_back({golden->runs[i].prompt, "prompt " + std::to_string(i) + " (the --expect file's prompts[" + std::to_string(i) + "])", true});
  return out;
}

// The --expect file's run of each prompt (an index into golden.runs): the file's logits are for
// its own prompts, so one it does not hold cannot be checked.
std::vector<std::size_t> expected_runs(const std::vector<Prompt>& prompts, const Golden& golden) {
  std::vector<std::size_t> out;
  for (const Prompt& p : prompts) {
    const auto it = std::find_if(golden.runs.begin(), golden.runs.end(), [&](const GoldenRun& r) { return r.prompt == p.ids; });
    if (it == golden.runs.end())
      bad_usage(p.name, " (", join(p.ids), ") is not among the --expect file's ", golden.runs.size(),
                " prompts, and its logits are for those; drop --prompt/--prompts to run all of them");
    out.push_back(static_cast<std::size_t>(it - golden.runs.begin()));
  }
  return out;
}

// A prompt indexes rows of the embedding table (read_rows and the resident copy alike read row `id`
// directly), so each id must be a row the table really has; the whole sequence must fit the
// positions the model was trained for. Every process checks every prompt, not only its share, so
// that all refuse alike before any of them loads anything.
void check_prompt(const Prompt& prompt, std::size_t new_tokens, bool count_from_golden, const accel::Checkpoint& checkpoint,
                  const LlamaConfig& config) {
  const auto& shape = checkpoint.entry(*checkpoint.find("model.embed_tokens.weight")).shape;  // checked: [vocab, hidden]
  const auto rows = static_cast<std::uint64_t>(shape[0]);
  for (const std::int64_t id : prompt.ids) {
    if (static_cast<std::uint64_t>(id) < rows) continue;
    const std::string problem = prompt.name + " holds token " + std::to_string(id) +
                                ", outside the vocabulary: 'model.embed_tokens.weight' has " + std::to_string(rows) +
                                " rows, so ids go from 0 to " + std::to_string(rows - 1);
    if (prompt.from_golden) bad_golden(problem, "; it was made for another model");
    bad_usage(problem);
  }
  if (prompt.ids.size() + new_tokens > config.max_positions) {
    const std::string problem = prompt.name + " has " + std::to_string(prompt.ids.size()) + " tokens; with " +
                                std::to_string(new_tokens) + " new tokens it needs " + std::to_string(prompt.ids.size() + new_tokens) +
                                " positions, more than config.json's max_position_embeddings " + std::to_string(config.max_positions);
    if (prompt.from_golden && count_from_golden) bad_golden(problem, "; it was made for another model");
    bad_usage(problem, "; give fewer --new-tokens or a shorter prompt");
  }
}

// ---------------------------------------------------------------------------------------------
// The arithmetic

// Element i of a weight in the dtype it was loaded in.
float element(const std::byte* data, accel::DType dtype, std::size_t i) {
  switch (dtype) {
    case accel::DType::F32: {
      float f;
      std::memcpy(&f, data + i * 4, 4);
      return f;
    }
    case accel::DType::BF16:
    case accel::DType::F16: {
      std::uint16_t h;
      std::memcpy(&h, data + i * 2, 2);
      return dtype == accel::DType::BF16 ? accel::bf16_to_float(h) : accel::half_to_float(h);
    }
    default:
      not_implemented("weights of dtype ", accel::torch_name(dtype), " are not supported (float32, bfloat16, float16)");
  }
}
// A loaded weight as the host sees it.
struct Weight {
  const std::byte* data = nullptr;
  accel::DType dtype = accel::DType::F32;
  std::size_t rows = 0, cols = 0;  // [rows, cols] row-major; a vector is [n, 1]

  std::vector<float> to_floats() const {
    std::vector<float> out(rows * cols);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = element(data, dtype, i);
    return out;
  }
  // Row r as floats: in place for float32, else converted into `buf`.
  const float* row(std::size_t r, std::vector<float>& buf) const {
    const std::byte* src = data + r * cols * (dtype == accel::DType::F32 ? 4 : 2);
    if (dtype == accel::DType::F32) return reinterpret_cast<const float*>(src);  // loads are 256-byte aligned
    buf.resize(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * c, 2);
      buf[c] = dtype == accel::DType::BF16 ? accel::bf16_to_float(h) : accel::half_to_float(h);
    }
    return buf.data();
  }
  // y = W x (a dot product per row with eight running sums)
  void matvec(const float* x, float* y) const {
    std::vector<float> buf;
    for (std::size_t r = 0; r < rows; ++r) {
      const float* w = row(r, buf);
      float acc[8] = {};
      std::size_t c = 0;
      for (; c + 8 <= cols; c += 8)
        for (std::size_t k = 0; k < 8; ++k) acc[k] += w[c + k] * x[c + k];
      for (; c < cols; ++c) acc[0] += w[c] * x[c];
      y[r] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }
};

// Host views of tensors wherever they live: host memory as is; device memory copied back through
// the device's own interface (a real GPU), or read in place when the device is host-simulated.
class HostViews {
 public:
  HostViews(std::vector<accel::DeviceMemoryPtr> devices, bool copy_back) : devices_(std::move(devices)), copy_back_(copy_back) {}

  // `data` of `bytes` on GPU `gpu`, or on the host when gpu is nullopt.
  const std::byte* view(const void* data, std::uint64_t bytes, std::optional<int> gpu) {
    if (!gpu) return static_cast<const std::byte*>(data);
    auto& dev = devices_.at(static_cast<std::size_t>(*gpu));
    if (dev->host_accessible() && !copy_back_) return static_cast<const std::byte*>(data);
    auto [it, fresh] = streams_.try_emplace(*gpu);
    if (fresh) it->second = accel::Stream(dev);
    auto& scratch = scratch_.emplace_back(static_cast<std::size_t>(bytes));
    dev->copy_to_host_async(scratch.data(), data, bytes, it->second.get());
    dev->synchronize(it->second.get());
    copied_back_ += bytes;
    return scratch.data();
  }
  void clear() { scratch_.clear(); }
  [[nodiscard]] std::uint64_t copied_back() const noexcept { return copied_back_; }
  [[nodiscard]] const std::vector<accel::DeviceMemoryPtr>& devices() const noexcept { return devices_; }

 private:
  std::vector<accel::DeviceMemoryPtr> devices_;
  bool copy_back_;
  std::map<int, accel::Stream> streams_;
  std::deque<std::vector<std::byte>> scratch_;
  std::uint64_t copied_back_ = 0;
};

Weight weight_of(const accel::FetchedModule& module, const std::string& name, HostViews& views,
                 std::optional<int> execution_gpu) {
  const accel::FetchedTensor* t = module.find(name);
  if (!t) bad_checkpoint("the loaded model has no tensor '", name, "'");
  const auto& h = *t->handle;
  // Checked in the checkpoint already; the load dtype (--dtype) is one of these too.
  if (!computes_with(h.dtype))
    not_implemented("'", name, "' is ", accel::torch_name(h.dtype), "; this example reads float32, bfloat16 and float16");
  // Resident tensors stay on their own GPU; offloaded ones arrived in a fetch buffer on the execution GPU.
  const std::optional<int> gpu = h.storage == accel::Storage::device ? std::optional<int>(h.placement.index) : execution_gpu;
  Weight w{views.view(t->data, h.size_bytes, gpu), h.dtype, static_cast<std::size_t>(h.shape.empty() ? 1 : h.shape[0]), 1};
  if (h.shape.size() == 2) w.cols = static_cast<std::size_t>(h.shape[1]);
  return w;
}

void rms_norm(const float* x, const std::vector<float>& weight, double eps, float* out) {
  const std::size_t n = weight.size();
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(n) + static_cast<float>(eps));
  for (std::size_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
}

// Rotary embedding of one head in place (transformers' rotate_half convention).
void rope(float* v, std::size_t head_dim, std::int64_t position, const std::vector<float>& inv_freq) {
  const std::size_t half = head_dim / 2;
  for (std::size_t j = 0; j < half; ++j) {
    const float angle = static_cast<float>(position) * inv_freq[j];
    const float c = std::cos(angle), s = std::sin(angle), a = v[j], b = v[j + half];
    v[j] = a * c - b * s;
    v[j + half] = b * c + a * s;
  }
}

// Per step: wall time, bytes that crossed to the execution device.
struct StepStats {
  double ms = 0;
  std::uint64_t streamed = 0;
};

// One sequence's KV cache: per layer, the keys and values of every position run so far
// ([position][kv_heads × head_dim]). Each sequence has its own; a pipeline stage fills only the
// entries of its own layers.
struct KvCache {
  explicit KvCache(std::size_t layers) : keys(layers), values(layers) {}
  std::vector<std::vector<float>> keys, values;
};

// The decoder over a model whose config check_config_against_checkpoint has checked: every size
// below is a dimension of the weights it indexes. It holds no sequence state: each call takes the
// sequence's KvCache, so one Decoder serves any number of sequences, one step at a time.
class Decoder {
 public:
  Decoder(accel::DispatchedModel& model, LlamaConfig config, HostViews& views)
      : model_(model), c_(config), views_(views) {
    for (std::size_t l = 0; l < c_.layers; ++l) order_.push_back("model.layers." + std::to_string(l));
    order_.push_back("model.norm");
    // A tied head is the embedding table itself: streamed whole when it is offloaded.
    head_ = model_.find("lm_head.weight") && model_.find("lm_head.weight")->name == "lm_head.weight" ? "lm_head" : "model.embed_tokens";
    order_.push_back(head_);
    for (std::size_t j = 0; j < c_.head_dim / 2; ++j)
      inv_freq_.push_back(static_cast<float>(1.0 / std::pow(c_.rope_theta, 2.0 * static_cast<double>(j) / static_cast<double>(c_.head_dim))));
  }

  // One step of one sequence through the whole model: `ids` (the prompt, or the last token) are
  // embedded, run through every layer with the sequence's `cache`, and the head gives the logits of
  // the last position. A pipeline stage calls the three parts itself: embed on the first stage,
  // run_layers over the stage's own layers, head on the last.
  std::vector<float> step(KvCache& cache, const std::vector<std::int64_t>& ids, StepStats& stats) {
    std::vector<float> h = embed(ids, stats);
    run_layers(cache, 0, c_.layers, h, ids.size(), stats, c_.layers);
    return head(h, ids.size(), stats);
  }

  // The hidden states of `ids` ([n][hidden]): the input embedding's rows (read_rows for a table off
  // the GPUs, the resident rows otherwise).
  std::vector<float> embed(const std::vector<std::int64_t>& ids, StepStats& stats) {
    const accel::TensorHandle& table = model_.at("model.embed_tokens.weight");
    const std::size_t hidden = c_.hidden, row = table.size_bytes / static_cast<std::size_t>(table.shape[0]);
    std::vector<std::byte> rows(ids.size() * row);
    if (table.storage != accel::Storage::device) {
      if (const auto gpu = model_.execution_device()) {
        // The rows cross to the execution GPU through a buffer as large as its free memory allows,
        // at most the whole prompt: the plan keeps no room for a long prompt's rows at once.
        const auto& device = views_.devices().at(static_cast<std::size_t>(*gpu));
        const std::size_t fit = static_cast<std::size_t>(device->memory_info().free_bytes / row);
        const std::size_t per_copy = std::clamp<std::size_t>(fit, 1, ids.size());  // 1 when none fits: refused by name
        accel::DeviceBuffer buffer(device, per_copy * row);
        for (std::size_t k = 0; k < ids.size(); k += per_copy) {
          const std::size_t count = std::min(per_copy, ids.size() - k);
          model_.read_rows(table.name, std::span(ids).subspan(k, count), buffer.get());
          std::memcpy(rows.data() + k * row, views_.view(buffer.get(), count * row, gpu), count * row);
        }
        stats.streamed += rows.size();
      } else {
        model_.read_rows(table.name, ids, rows.data());
      }
    } else {
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const auto* src = static_cast<const std::byte*>(table.device_ptr) + static_cast<std::size_t>(ids[k]) * row;
        std::memcpy(rows.data() + k * row, views_.view(src, row, table.placement.index), row);
      }
    }
    views_.clear();
    std::vector<float> h(ids.size() * hidden);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = element(rows.data(), table.dtype, i);
    return h;
  }

  // Layers [first, last) over `h`, the hidden states of the sequence's next `n` positions, in
  // place; each layer appends those positions' keys and values to its entry of `cache` (whose
  // length gives the positions). While a layer computes, the next module is prefetched: the next
  // layer of the range, then module `after` (the final norm when the whole model runs here; on a
  // pipeline stage what it runs next: its norm or head, else its first layer again).
  void run_layers(KvCache& cache, std::size_t first, std::size_t last, std::vector<float>& h, std::size_t n, StepStats& stats,
                  std::size_t after) {
    for (std::size_t m = first; m < last; ++m) {
      accel::FetchedModule module = model_.fetch(order_[m]);
      stats.streamed += offloaded_bytes(module);
      if (overlap()) model_.prefetch(order_[m + 1 < last ? m + 1 : after]);
      layer(m, module, cache, h, n);
      views_.clear();
    }
  }

  // The final norm and the head on the last of the `n` positions of `h` (only it predicts the next
  // token): the logits. `next` is the layer the next call on this process starts with, prefetched
  // meanwhile: 0, or a last stage's first layer.
  std::vector<float> head(std::vector<float>& h, std::size_t n, StepStats& stats, std::size_t next = 0) {
    final_norm(h, n, stats, head_);
    return logits(h, n, stats, order_[next]);
  }

  // The final norm on the last of the `n` positions of `h`, in place (the other positions predict
  // nothing); `prefetch`: the module this process runs next (the head, or a stage's first layer).
  void final_norm(std::vector<float>& h, std::size_t n, StepStats& stats, const std::string& prefetch) {
    float* last = &h[(n - 1) * c_.hidden];
    accel::FetchedModule module = model_.fetch(order_[c_.layers]);  // model.norm
    stats.streamed += offloaded_bytes(module);
    if (overlap()) model_.prefetch(prefetch);
    const auto norm = weight_of(module, "model.norm.weight", views_, model_.execution_device()).to_floats();
    rms_norm(last, norm, c_.eps, last);
    views_.clear();
  }

  // The head on the last of the `n` positions of `h` (normed): the logits; `prefetch`: the module
  // this process runs next.
  std::vector<float> logits(const std::vector<float>& h, std::size_t n, StepStats& stats, const std::string& prefetch) {
    accel::FetchedModule module = model_.fetch(head_);
    stats.streamed += offloaded_bytes(module);
    if (overlap()) model_.prefetch(prefetch);
    std::vector<float> out(c_.vocab);
    weight_of(module, head_ + ".weight", views_, model_.execution_device()).matvec(&h[(n - 1) * c_.hidden], out.data());
    views_.clear();
    return out;
  }

  // The execution order's module `m`: layer m, the final norm (m = layers), the head (layers + 1).
  [[nodiscard]] const std::string& module(std::size_t m) const { return order_.at(m); }

 private:
  // Prefetching needs a second fetch buffer: with one, the prefetch would wait for the module in use.
  bool overlap() const { return model_.fetch_buffer_count() > 1; }

  std::uint64_t offloaded_bytes(const accel::FetchedModule& module) const {
    std::uint64_t bytes = 0;
    if (model_.execution_device())
      for (const auto& t : module.tensors())
        if (t.handle->storage != accel::Storage::device) bytes += t.handle->size_bytes;
    return bytes;
  }

  void layer(std::size_t l, const accel::FetchedModule& module, KvCache& cache, std::vector<float>& h, std::size_t n) {
    const std::string p = order_[l] + ".";
    const auto gpu = model_.execution_device();
    auto w = [&](const char* name) { return weight_of(module, p + name, views_, gpu); };
    const auto ln1 = w("input_layernorm.weight").to_floats(), ln2 = w("post_attention_layernorm.weight").to_floats();
    const Weight wq = w("self_attn.q_proj.weight"), wk = w("self_attn.k_proj.weight"), wv = w("self_attn.v_proj.weight"),
                 wo = w("self_attn.o_proj.weight"), wg = w("mlp.gate_proj.weight"), wu = w("mlp.up_proj.weight"),
                 wd = w("mlp.down_proj.weight");
    const std::size_t hidden = c_.hidden, hd = c_.head_dim, q_dim = c_.q_dim, kv_dim = c_.kv_dim, inter = c_.intermediate;
    auto& keys = cache.keys.at(l);
    auto& values = cache.values.at(l);
    std::vector<float> x(hidden), q(q_dim), k(kv_dim), v(kv_dim), attn(q_dim), o(hidden), g(inter), u(inter), d(hidden);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const std::size_t group = c_.heads / c_.kv_heads;
    for (std::size_t t = 0; t < n; ++t) {
      float* ht = &h[t * hidden];
      const auto pos = static_cast<std::int64_t>(keys.size() / kv_dim);  // positions cached so far
      rms_norm(ht, ln1, c_.eps, x.data());
      wq.matvec(x.data(), q.data());
      wk.matvec(x.data(), k.data());
      wv.matvec(x.data(), v.data());
      for (std::size_t head = 0; head < c_.heads; ++head) rope(&q[head * hd], hd, pos, inv_freq_);
      for (std::size_t head = 0; head < c_.kv_heads; ++head) rope(&k[head * hd], hd, pos, inv_freq_);
      keys.insert(keys.end(), k.begin(), k.end());
      values.insert(values.end(), v.begin(), v.end());
      const std::size_t len = keys.size() / kv_dim;  // causal: this token and every earlier one
      std::vector<float> scores(len);
      for (std::size_t head = 0; head < c_.heads; ++head) {
        const float* qh = &q[head * hd];
        const std::size_t kvh = head / group;
        float top = -INFINITY;
        for (std::size_t s = 0; s < len; ++s) {
          float dot = 0;
          for (std::size_t i = 0; i < hd; ++i) dot += qh[i] * keys[s * kv_dim + kvh * hd + i];
          scores[s] = dot * scale;
          top = std::max(top, scores[s]);
        }
        float sum = 0;
        for (auto& s : scores) sum += (s = std::exp(s - top));
        float* out = &attn[head * hd];
        std::fill(out, out + hd, 0.0f);
        for (std::size_t s = 0; s < len; ++s)
          for (std::size_t i = 0; i < hd; ++i) out[i] += scores[s] / sum * values[s * kv_dim + kvh * hd + i];
      }
      wo.matvec(attn.data(), o.data());
      for (std::size_t i = 0; i < hidden; ++i) ht[i] += o[i];
      rms_norm(ht, ln2, c_.eps, x.data());
      wg.matvec(x.data(), g.data());
      wu.matvec(x.data(), u.data());
      for (std::size_t i = 0; i < inter; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      wd.matvec(g.data(), d.data());
      for (std::size_t i = 0; i < hidden; ++i) ht[i] += d[i];
    }
  }

  accel::DispatchedModel& model_;
  LlamaConfig c_;
  HostViews& views_;
  std::vector<std::string> order_;  // execution order: layers, final norm, head
  std::string head_;
  std::vector<float> inv_freq_;
};

// The greedy token of a step. A NaN or infinite logit means the arithmetic broke down (a NaN or
// infinite weight, an overflow); max_element would still pick some index, so it is refused instead.
std::int64_t greedy_token(const std::vector<float>& logits, const Prompt& prompt, std::size_t step, std::size_t position) {
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      bad_checkpoint(prompt.name, ", step ", step, " (the logits after position ", position, "): the logit of token ", i, " is ",
                     logits[i], ", so no token can be chosen; check the weights for NaN or infinite values and config.json's ",
                     "rms_norm_eps and rope settings");
  return static_cast<std::int64_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The largest difference between a step's logits and the expected ones, relative to the step's
// largest expected logit (all-zero expected logits: compared absolutely).
double logit_error(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0, diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// What one prompt produced on the replica that ran it; gathered to every process. The logits stay
// where they were computed: the replica compares them with the --expect file and sends the error.
struct PromptResult {
  std::vector<std::int64_t> tokens;
  double prefill_ms = 0;
  std::uint64_t prefill_streamed = 0;  // bytes that crossed to the execution device in the prefill
  std::vector<double> decode_ms;       // per decode step
  std::uint64_t decode_streamed = 0;   // over every decode step
  double worst_error = 0;              // the largest logit_error of its steps (0 without --expect)
  std::size_t worst_step = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(PromptResult, tokens, prefill_ms, prefill_streamed, decode_ms, decode_streamed, worst_error,
                                   worst_step)

// Greedy decoding of one prompt, `new_tokens` steps, with a KV cache of its own; each step's logits
// compared with `expected`'s when given. The driver of one sequence on one process holding every
// layer (generate_pipelined runs the same steps split over stages).
PromptResult generate(Decoder& decoder, const LlamaConfig& config, const Prompt& prompt, std::size_t new_tokens,
                      const GoldenRun* expected) {
  PromptResult r;
  KvCache cache(config.layers);
  std::vector<std::int64_t> input = prompt.ids;
  for (std::size_t s = 0; s < new_tokens; ++s) {
    StepStats st;
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<float> logits = decoder.step(cache, input, st);
    st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0) {
      r.prefill_ms = st.ms;
      r.prefill_streamed = st.streamed;
    } else {
      r.decode_ms.push_back(st.ms);
      r.decode_streamed += st.streamed;
    }
    r.tokens.push_back(greedy_token(logits, prompt, s, prompt.ids.size() + s - 1));
    if (expected) {  // check_golden_against_model: as many steps and as many logits per step
      const double error = logit_error(logits, expected->logits[s]);
      if (error > r.worst_error) {
        r.worst_error = error;
        r.worst_step = s;
      }
    }
    input = {r.tokens.back()};
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Pipeline stages

// What one pipeline stage runs of the execution order (the input embedding, then layers, the final
// norm, the head), read from its device map: a module is the stage's when the map places it.
struct StageRole {
  bool embed = false, norm = false, head = false;
  std::optional<std::size_t> first_layer, end_layer;  // its layers [first, end); unset: none

  [[nodiscard]] std::string describe() const {
    std::vector<std::string> parts;
    if (embed) parts.emplace_back("embedding");
    if (first_layer && *first_layer < *end_layer)
      parts.push_back(*end_layer - *first_layer == 1 ? "layer " + std::to_string(*first_layer)
                                                     : "layers " + std::to_string(*first_layer) + "-" + std::to_string(*end_layer - 1));
    if (norm) parts.emplace_back("final norm");
    if (head) parts.emplace_back("head");
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
    return out.empty() ? "no weights (passes the hidden states on)" : out;
  }
};

StageRole stage_role(const accel::DeviceMap& map, const LlamaConfig& c) {
  StageRole r;
  r.embed = map.placement_of("model.embed_tokens.weight").has_value();
  r.norm = map.placement_of("model.norm.weight").has_value();
  r.head = map.placement_of("lm_head.weight").has_value();  // a tied head: the stage's own copy
  for (std::size_t l = 0; l < c.layers; ++l) {
    if (!map.placement_of("model.layers." + std::to_string(l) + ".input_layernorm.weight")) continue;
    if (!r.first_layer) r.first_layer = l;
    if (r.end_layer && *r.end_layer != l)
      not_implemented("the pipeline plan gives one stage layers ", *r.first_layer, "-", *r.end_layer - 1, " and ", l,
                      ", not one contiguous run; this example runs a stage's layers in one run");
    r.end_layer = l + 1;
  }
  return r;
}

// The stages must take the model in execution order, each module once: the embedding on the first,
// layers in contiguous runs that follow each other, the final norm after the last layer, the head
// on the last stage (it sends the token back to the first). plan_pipeline cuts the execution order
// so; checked, since the driver relies on it. Returns the stages' roles with empty layer runs set
// to where the previous run ended.
std::vector<StageRole> stage_roles(const accel::PipelineLoadPlan& plan, const LlamaConfig& c) {
  std::vector<StageRole> roles;
  std::size_t next_layer = 0;
  bool normed = false;
  for (int s = 0; s < plan.stages(); ++s) {
    StageRole r = stage_role(plan.stage_map(s), c);
    auto wrong = [&](const std::string& what) {
      not_implemented("the pipeline plan's stage ", s, " holds ", r.describe(), ": ", what,
                      "; this example runs the embedding on the first stage, then the layers in order, the final norm and the "
                      "head on the last");
    };
    if (r.embed != (s == 0)) wrong(s == 0 ? "not the embedding" : "the embedding, which the first stage needs");
    if (r.head != (s + 1 == plan.stages())) wrong(r.head ? "the head before the last stage" : "not the head");
    if (r.first_layer) {
      if (normed || *r.first_layer != next_layer)
        wrong("layers out of order (the next is layer " + std::to_string(next_layer) + (normed ? ", after the final norm)" : ")"));
      next_layer = *r.end_layer;
    } else {
      r.first_layer = r.end_layer = next_layer;
    }
    if (r.norm) {
      if (next_layer != c.layers) wrong("the final norm before layer " + std::to_string(next_layer));
      normed = true;
    }
    roles.push_back(r);
  }
  if (!normed) not_implemented("the pipeline plan places no stage on the final norm");
  return roles;
}

// What each process of a pipelined run did, for the report.
struct StageReport {
  std::size_t replica = 0, stage = 0;
  std::string role;                // StageRole::describe()
  std::uint64_t weight_bytes = 0;  // the weights it holds in memory (its GPUs' and the host's)
  std::uint64_t disk_bytes = 0;    // and those it reads from disk
  double busy_s = 0;               // computing
  double wall_s = 0;               // from the start of the generation to its last message
  std::uint64_t streamed = 0;      // bytes streamed to its execution device
  std::size_t steps = 0;           // sequence steps it computed
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StageReport, replica, stage, role, weight_bytes, disk_bytes, busy_s, wall_s, streamed, steps)

// How a stage's messages travel. The CPU backend takes host memory: the vectors go as they are.
// A communicator that takes device memory (NCCL: device_buffers()) gets each message staged through
// a buffer on this process's first GPU, as an engine whose activations live on its GPU would send
// them from there; with --copy-back the messages are staged so over simulated GPUs too, which runs
// this path without a GPU.
class StageLink {
 public:
  // `gpu`: where messages are staged; null: they go from host memory.
  StageLink(accel::Communicator& group, accel::DeviceMemoryPtr gpu) : group_(group), gpu_(std::move(gpu)) {
    if (gpu_) stream_ = accel::Stream(gpu_);
  }
  [[nodiscard]] accel::Communicator& group() const noexcept { return group_; }

  // Sends `data` to stage `dst` without waiting for it to be taken; `data` and `staged` (where the
  // message is staged on the GPU) must live until the handle's wait().
  template <class T>
  [[nodiscard]] accel::CollectiveHandle send(std::span<T> data, accel::DeviceBuffer& staged, int dst) {
    if (!gpu_) return accel::send_async(group_, data, dst);
    staged = accel::DeviceBuffer(gpu_, data.size_bytes());
    gpu_->copy_to_device_async(staged.get(), data.data(), data.size_bytes(), stream_.get());
    gpu_->synchronize(stream_.get());
    return accel::send_async(group_, std::span<T>(static_cast<T*>(staged.get()), data.size()), dst);
  }

  // Receives the next message from stage `src` into `into` (its length is the message's).
  template <class T>
  void recv(std::span<T> into, int src) {
    if (!gpu_) return accel::recv(group_, into, src);
    accel::DeviceBuffer staged(gpu_, into.size_bytes());
    accel::recv(group_, std::span<T>(static_cast<T*>(staged.get()), into.size()), src);
    gpu_->copy_to_host_async(into.data(), staged.get(), into.size_bytes(), stream_.get());
    gpu_->synchronize(stream_.get());
  }

 private:
  accel::Communicator& group_;
  accel::DeviceMemoryPtr gpu_;
  accel::Stream stream_;
};

// A replica's prompts generated over its S stages: this process is stage group.rank() of
// group.size(), the replica's stage group (`link`'s). Each sequence is one micro-batch, and every stage takes
// them in the same order, a step at a time: step t of sequence 0, 1, ..., then step t + 1 of each.
// The first stage embeds the step's input (the prompt, then the token the last stage sent back),
// runs its layers and sends the hidden states ([n][hidden], n the step's positions, which every
// stage knows from the prompts) to the next; a middle stage receives, runs its layers, sends on; the
// last runs its layers, the norm and the head, picks the token, compares the logits with --expect,
// and sends {token, error} back to the first. Sends are asynchronous (send_async), so no stage waits
// for its successor to take a message, and the first stage computes the other sequences' steps while
// a token comes back: with at least S sequences every stage has work, with fewer the pipeline has
// bubbles. Returns every sequence's result on the first stage (tokens, errors, and as step times
// the time from the step's start there to its token's return), nothing on the others.
std::vector<PromptResult> generate_pipelined(Decoder& decoder, const LlamaConfig& config, const StageRole& role, StageLink& link,
                                             std::span<const Prompt> prompts, std::size_t new_tokens,
                                             const std::vector<const GoldenRun*>& expected, StageReport& report) {
  using clock = std::chrono::steady_clock;
  const int stage = link.group().rank(), stages = link.group().size();
  const bool first = stage == 0;
  const std::size_t m = prompts.size(), layers = config.layers;
  // The module this process runs first in a step, and what it prefetches after each part.
  const std::size_t cycle = *role.first_layer < *role.end_layer ? *role.first_layer : role.norm ? layers : layers + 1;
  const std::size_t after_layers = role.norm ? layers : role.head ? layers + 1 : cycle;
  std::vector<KvCache> caches(m, KvCache(layers));
  std::vector<PromptResult> results(first ? m : 0);
  std::vector<clock::time_point> started(m);
  StepStats stats;
  auto timed = [&](auto&& work) {
    const auto t0 = clock::now();
    work();
    report.busy_s += std::chrono::duration<double>(clock::now() - t0).count();
  };
  // Messages in flight: their data lives here until the send's wait() (a deque keeps elements in
  // place). A sequence has one step in the pipeline at a time, so when this process received step t
  // of sequence i, the message it sent for step t - 1 has been taken: keeping the last m sends
  // bounds the memory and never waits.
  struct InFlight {
    std::vector<float> hidden;
    std::array<double, 2> token{};
    accel::DeviceBuffer staged;
    accel::CollectiveHandle handle;
  };
  std::deque<InFlight> sends;
  auto settle = [&](std::size_t keep) {
    for (; sends.size() > keep; sends.pop_front()) sends.front().handle.wait();
  };
  // On the first stage: the token of sequence i's step t, back from the last stage.
  auto take_token = [&](std::size_t i, std::size_t t) {
    std::array<double, 2> message{};
    link.recv(std::span<double>(message), stages - 1);
    PromptResult& r = results[i];
    r.tokens.push_back(static_cast<std::int64_t>(message[0]));
    const double ms = std::chrono::duration<double, std::milli>(clock::now() - started[i]).count();
    if (t == 0) r.prefill_ms = ms;
    else r.decode_ms.push_back(ms);
    if (message[1] > r.worst_error) {
      r.worst_error = message[1];
      r.worst_step = t;
    }
  };
  for (std::size_t t = 0; t < new_tokens; ++t)
    for (std::size_t i = 0; i < m; ++i) {
      const Prompt& prompt = prompts[i];
      const std::size_t n = t == 0 ? prompt.ids.size() : 1;
      std::vector<float> h;
      if (first) {
        if (t > 0) take_token(i, t - 1);
        const std::vector<std::int64_t> ids = t == 0 ? prompt.ids : std::vector<std::int64_t>{results[i].tokens.back()};
        started[i] = clock::now();
        timed([&] { h = decoder.embed(ids, stats); });
      } else {
        h.resize(n * config.hidden);
        link.recv(std::span<float>(h), stage - 1);
      }
      std::vector<float> logits;
      timed([&] {
        decoder.run_layers(caches[i], *role.first_layer, *role.end_layer, h, n, stats, after_layers);
        if (role.norm) decoder.final_norm(h, n, stats, decoder.module(role.head ? layers + 1 : cycle));
        if (role.head) logits = decoder.logits(h, n, stats, decoder.module(cycle));
      });
      ++report.steps;
      InFlight& out = sends.emplace_back();
      if (role.head) {
        const std::int64_t token = greedy_token(logits, prompt, t, prompt.ids.size() + t - 1);
        out.token = {static_cast<double>(token), expected[i] ? logit_error(logits, expected[i]->logits[t]) : 0.0};
        out.handle = link.send(std::span<double>(out.token), out.staged, 0);
      } else {
        out.hidden = std::move(h);
        out.handle = link.send(std::span<float>(out.hidden), out.staged, stage + 1);
      }
      settle(m);
    }
  if (first)
    for (std::size_t i = 0; i < m; ++i) take_token(i, new_tokens - 1);
  settle(0);
  report.streamed = stats.streamed;
  return results;
}

// The options of this process's plan and load. The GPUs it plans and loads on: with
// --simulate-gpus its own simulated ones (each process of a job makes its own), with --no-gpu none;
// unset otherwise (every visible CUDA GPU alone, and under a launcher its own group: accel launch
// --gpus_per_process K; none with --cpu).
accel::AutoDispatchOptions dispatch_options(const Args& args) {
  accel::AutoDispatchOptions options;
  options.device_map = args.device_map;
  options.objective = args.objective;
  if (args.max_memory) options.max_memory = accel::parse_max_memory(*args.max_memory);
  options.load.progress = false;
  if (args.dtype) options.load.dtype = accel::dtype_from_string(*args.dtype);
  if (args.offload_folder) options.load.offload_folder = *args.offload_folder;
  if (args.simulate_gpus) {
    std::vector<std::uint64_t> sizes;
    for (const auto& s : split(*args.simulate_gpus, ',')) sizes.push_back(accel::parse_byte_size(s));
    options.load.devices = accel::host_simulated_devices(sizes);
  } else if (args.no_gpu) {
    options.load.devices = std::vector<accel::DeviceMemoryPtr>{};
  }
  return options;
}

accel::AutoDispatchPlan plan_load(const Args& args, const accel::Checkpoint& checkpoint, const accel::DistributedState& state) {
  accel::AutoDispatchOptions options = dispatch_options(args);
  if (!options.load.devices && state.use_distributed()) return accel::plan_auto_dispatch(checkpoint, state, options);
  if (!options.load.devices) options.load.devices = accel::cuda_device_memories();
  return accel::plan_auto_dispatch(checkpoint, options);
}

// Every process must compute the same stages, so they plan under the same budgets: --max-memory,
// or else the budgets process 0 measures over its own GPUs and RAM (measured ones differ a little
// from process to process), sent to all. Encoded as {GPU count, each GPU's bytes, cpu, disk}, with
// no_budget for an unset cpu or disk; empty when process 0 could not measure them (it throws its
// error, the others one naming it).
accel::MaxMemory agreed_budgets(accel::DistributedState& state, const std::vector<accel::DeviceMemoryPtr>& devices) {
  constexpr std::uint64_t no_budget = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> mine;
  std::exception_ptr failed;
  if (state.is_main_process()) {
    try {
      const accel::MaxMemory measured = accel::measured_max_memory(devices);
      mine.push_back(measured.gpus.size());
      for (const auto& [index, bytes] : measured.gpus) mine.push_back(bytes);  // keys 0..n-1: the devices' order
      mine.push_back(measured.cpu.value_or(no_budget));
      mine.push_back(measured.disk.value_or(no_budget));
    } catch (const accel::error&) {
      failed = std::current_exception();
    }
  }
  const auto all = accel::broadcast_object(state, mine);
  if (failed) std::rethrow_exception(failed);
  if (all.empty()) not_implemented("process 0 could not measure the budgets the stages are planned under; give --max-memory");
  accel::MaxMemory budgets;
  const std::size_t gpus = static_cast<std::size_t>(all.at(0));
  for (std::size_t i = 0; i < gpus; ++i) budgets.gpus[static_cast<int>(i)] = all.at(1 + i);
  if (all.at(1 + gpus) != no_budget) budgets.cpu = all[1 + gpus];
  if (all.at(2 + gpus) != no_budget) budgets.disk = all[2 + gpus];
  return budgets;
}

// The pipeline's stages, as every process of the job computes them (AutoDispatchOptions::stages).
accel::PipelineLoadPlan plan_stages(const Args& args, const accel::Checkpoint& checkpoint, accel::DistributedState& state) {
  accel::AutoDispatchOptions options = dispatch_options(args);
  options.stages = static_cast<int>(args.stages);
  const bool own_gpus = !options.load.devices;  // the process's CUDA group
  if (!options.max_memory)
    options.max_memory = agreed_budgets(state, own_gpus ? accel::group_device_memories(state, accel::cuda_device_memories())
                                                        : *options.load.devices);
  if (own_gpus) return accel::plan_pipeline_load(checkpoint, state, options);
  return accel::plan_pipeline_load(checkpoint, options);
}

void print_placement(const Args& args, const accel::AutoDispatchPlan& plan, const accel::DispatchedModel& model, std::size_t replicas) {
  std::printf("placement (%s, objective %s%s):\n", args.device_map.c_str(), std::string(accel::plan_objective_name(args.objective)).c_str(),
              replicas > 1 ? ("; the main process's copy, one of " + std::to_string(replicas) + " replicas").c_str() : "");
  std::map<accel::Placement, std::vector<std::string>> keys;
  for (const auto& [key, where] : plan.plan.device_map.entries()) keys[where].push_back(key.empty() ? "(all)" : key);
  for (const auto& [where, names] : keys) {
    const auto& totals = model.report().per_placement.at(where);
    const std::string device = where.is_gpu() ? "cuda:" + std::to_string(where.index) : where.to_string();
    std::printf("  %-6s %8llu bytes  %zu tensors  %s%s\n", device.c_str(), static_cast<unsigned long long>(totals.bytes), totals.tensors,
                names.front().c_str(),
                names.size() > 1 ? (" ... " + names.back() + " (" + std::to_string(names.size()) + " keys)").c_str() : "");
  }
  std::printf("fetch buffers: %zu x %llu bytes on %s\n", model.fetch_buffer_count(), static_cast<unsigned long long>(model.fetch_buffer_bytes()),
              model.execution_device() ? ("cuda:" + std::to_string(*model.execution_device())).c_str() : "the host (no GPU)");
}

// Prefill and decode times over every prompt, and the throughput of the whole generation. `job`
// says how the processes divided the work ("2 replicas", "1 replica x 2 stages"). In a pipeline a
// step's time runs from its start on the first stage to its token's return there, and what each
// stage streamed is in its own line (print_stage_reports), not here.
void print_stats(const std::vector<Prompt>& prompts, const std::vector<PromptResult>& results, double seconds, const std::string& job,
                 bool pipelined) {
  const auto plural = [](std::size_t n, const char* word) { return accel::text::plural(static_cast<long long>(n), word); };
  std::vector<double> decode;
  std::uint64_t prefill_streamed = 0, decode_streamed = 0;
  std::size_t prompt_tokens = 0, generated = 0;
  double prefill_ms = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    decode.insert(decode.end(), results[i].decode_ms.begin(), results[i].decode_ms.end());
    prefill_ms += results[i].prefill_ms;
    prefill_streamed += results[i].prefill_streamed;
    decode_streamed += results[i].decode_streamed;
    prompt_tokens += prompts[i].ids.size();
    generated += results[i].tokens.size();
  }
  std::sort(decode.begin(), decode.end());
  // With one new token per prompt there is no decode step to time.
  char decoded[96] = "no decode steps (one new token per prompt)";
  if (!decode.empty())
    std::snprintf(decoded, sizeof decoded, "decode median %.2f ms/token (p90 %.2f)", decode[decode.size() / 2],
                  decode[decode.size() * 9 / 10]);
  const std::string for_prompts = results.size() > 1 ? "for " + std::to_string(results.size()) + " prompts " : "";
  if (pipelined) {  // the prompts' steps overlap: a sum of their times would exceed the whole run's
    std::vector<double> prefill;
    for (const auto& r : results) prefill.push_back(r.prefill_ms);
    std::sort(prefill.begin(), prefill.end());
    std::printf("prefill median %.2f ms per prompt (%s, %s); %s; "
                "from the first stage to the token's return there, other prompts' steps in flight meanwhile\n",
                prefill.empty() ? 0.0 : prefill[prefill.size() / 2], plural(results.size(), "prompt").c_str(),
                plural(prompt_tokens, "token").c_str(), decoded);
  } else {
    char per_token[64] = "";
    if (!decode.empty())
      std::snprintf(per_token, sizeof per_token, ", %llu bytes streamed/token",
                    static_cast<unsigned long long>(decode_streamed / decode.size()));
    std::printf("prefill %.2f ms %s(%s, %llu bytes streamed); %s%s\n", prefill_ms, for_prompts.c_str(),
                plural(prompt_tokens, "token").c_str(), static_cast<unsigned long long>(prefill_streamed), decoded, per_token);
  }
  std::printf("generated %s for %s in %.3f s: %.1f tokens/s (%s)\n", plural(generated, "token").c_str(),
              plural(results.size(), "prompt").c_str(), seconds,
              seconds > 0 ? static_cast<double>(generated) / seconds : 0.0, job.c_str());
}

// The pipeline's stages as planned: what each runs, its weights and where they are, its estimated
// time per forward pass, and the imbalance (slowest / mean).
void print_pipeline(const Args& args, const accel::PipelineLoadPlan& plan, const std::vector<StageRole>& roles, std::size_t replicas) {
  const accel::PipelinePlan& p = plan.pipeline;
  std::printf("pipeline (%s, objective %s): %d stages per replica, %zu replica%s; estimated imbalance %.3f (slowest stage / mean)%s\n",
              args.device_map.c_str(), std::string(accel::plan_objective_name(args.objective)).c_str(), plan.stages(), replicas,
              replicas == 1 ? "" : "s", p.imbalance, p.parameter_split_kept ? ", the parameter-count split" : "");
  for (std::size_t s = 0; s < p.stages.size(); ++s) {
    const accel::PipelineStage& st = p.stages[s];
    std::printf("  stage %zu: %s; %llu bytes (gpu %llu, cpu %llu, disk %llu), estimated %.3g ms per pass\n", s, roles[s].describe().c_str(),
                static_cast<unsigned long long>(st.bytes), static_cast<unsigned long long>(st.gpu_bytes),
                static_cast<unsigned long long>(st.cpu_bytes), static_cast<unsigned long long>(st.disk_bytes), st.seconds * 1e3);
  }
}

// What each process did in a pipelined run: its stage, the weights it holds in memory against the
// whole model's (and those it reads from disk), how busy it was (computing / wall time: the rest is
// waiting for its predecessor, or bubbles), and what it streamed.
void print_stage_reports(const std::vector<StageReport>& reports, std::uint64_t model_bytes) {
  for (std::size_t rank = 0; rank < reports.size(); ++rank) {
    const StageReport& r = reports[rank];
    const std::string disk = r.disk_bytes ? ", " + std::to_string(r.disk_bytes) + " on disk" : "";
    std::printf("  process %zu (replica %zu, stage %zu: %s): %llu weight bytes in memory (%.2f of the model's %llu)%s, busy %.0f%% of "
                "%.3f s, %zu steps, %llu bytes streamed\n",
                rank, r.replica, r.stage, r.role.c_str(), static_cast<unsigned long long>(r.weight_bytes),
                model_bytes ? static_cast<double>(r.weight_bytes) / static_cast<double>(model_bytes) : 0.0,
                static_cast<unsigned long long>(model_bytes), disk.c_str(), r.wall_s > 0 ? 100.0 * r.busy_s / r.wall_s : 0.0, r.wall_s,
                r.steps, static_cast<unsigned long long>(r.streamed));
  }
}

// Every prompt's tokens against the --expect file's, and the largest logit error of any step:
// whether all match, and the line that says so. Every process decides alike from the same
// gathered results (and exits alike); the main process prints the line.
struct Check {
  bool ok = false;
  std::string line;
};
Check check_results(const std::vector<Prompt>& prompts, const std::vector<PromptResult>& results, const Golden& golden,
                    const std::vector<std::size_t>& expected, std::size_t new_tokens, double tolerance) {
  double worst = 0;
  std::size_t worst_prompt = 0;
  std::string differs;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i].worst_error > worst) {
      worst = results[i].worst_error;
      worst_prompt = i;
    }
    const auto& tokens = golden.runs[expected[i]].tokens;
    const std::vector<std::int64_t> want(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(new_tokens));
    if (differs.empty() && results[i].tokens != want) differs = "of " + prompts[i].name + " differ: expected " + join(want);
  }
  const bool ok = differs.empty() && worst <= tolerance;
  const std::string where = results.size() == 1 ? "step " + std::to_string(results[0].worst_step) + " of " + std::to_string(new_tokens)
                                                : "prompt " + std::to_string(worst_prompt) + "'s step " +
                                                      std::to_string(results[worst_prompt].worst_step) + "; " +
                                                      std::to_string(results.size()) + " prompts x " + std::to_string(new_tokens) + " steps";
  char error[32], limit[32];
  std::snprintf(error, sizeof error, "%.3g", worst);
  std::snprintf(limit, sizeof limit, "%.3g", tolerance);
  return {ok, std::string(ok ? "matches" : "DIFFERS FROM") + " transformers: tokens " + (differs.empty() ? "identical" : differs) +
                  ", logits max relative error " + error + " (" + where + " compared; tolerance " + limit + ")"};
}

// Everything the command line gives, read and checked: the prompts, the --expect file and the
// run of it each prompt has, the model's config.json checked against its tensors.
struct Inputs {
  std::vector<Prompt> prompts;
  std::optional<Golden> golden;
  std::vector<std::size_t> expected;  // with golden: each prompt's index in golden->runs
  std::size_t new_tokens = 0;
  accel::Checkpoint checkpoint;
  LlamaConfig config;
};

// Checks everything before anything is planned, loaded or computed: --stages against the job's
// `processes`, config.json on its own, then against the tensors the checkpoint really holds, then
// every prompt (not only this process's share) and the --expect file against both.
Inputs check_inputs(const Args& args, std::size_t processes) {
  if (processes % args.stages != 0)
    bad_usage("--stages ", args.stages, " does not divide the job's ", accel::text::plural(static_cast<long long>(processes), "process"),
              "; run R x S processes (R replicas of S stages each)");
  Inputs in;
  if (args.expect) in.golden = read_golden(*args.expect);
  in.prompts = prompts_to_run(args, in.golden);
  if (in.golden) in.expected = expected_runs(in.prompts, *in.golden);
  in.new_tokens = args.new_tokens.value_or(in.golden ? in.golden->new_tokens : 8);
  in.checkpoint = accel::resolve_checkpoint(args.checkpoint);
  if (!in.checkpoint.config_file)
    bad_checkpoint("no config.json next to the checkpoint in '", in.checkpoint.directory.string(),
                   "'; this example reads the model's sizes from it");
  in.config = LlamaConfig::from_json(read_json_file(*in.checkpoint.config_file, "model config"));
  check_config_against_checkpoint(in.config, in.checkpoint);
  for (const Prompt& p : in.prompts) check_prompt(p, in.new_tokens, !args.new_tokens, in.checkpoint, in.config);
  if (in.golden) check_golden_against_model(*in.golden, in.config.vocab, in.new_tokens);
  return in;
}

// What every process of a job must be given alike, as (what, value) pairs: the prompts and the new
// tokens (each process takes its share of one list), the model (its tensors' names and sizes and
// config.json's dimensions), and the stages; with stages, also what the stage plan is computed
// from, since every process computes it. A replica's own budgets and device map may differ.
using SharedInputs = std::vector<std::pair<std::string, std::string>>;

std::string digest(std::string_view text) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(accel::text::fnv1a(text)));
  return hex;
}

SharedInputs shared_inputs(const Args& args, const Inputs& in) {
  std::string ids, tensors;
  for (const Prompt& p : in.prompts) ids += join(p.ids) + ";";
  for (const std::string_view name : in.checkpoint.tensor_names)
    tensors += std::string(name) + "=" + std::to_string(in.checkpoint.entry(*in.checkpoint.find(name)).size_bytes()) + ";";
  const LlamaConfig& c = in.config;
  char dims[256];
  std::snprintf(dims, sizeof dims, "hidden %zu, intermediate %zu, %zu layers, %zu/%zu heads of %zu, vocabulary %zu, %zu positions%s",
                c.hidden, c.intermediate, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab, c.max_positions, c.tied ? ", tied" : "");
  SharedInputs shared = {
      {"--stages", std::to_string(args.stages)},
      {"prompts", accel::text::plural(static_cast<long long>(in.prompts.size()), "prompt") + " (token ids digest " + digest(ids) + ")"},
      {"new tokens per prompt", std::to_string(in.new_tokens)},
      {"checkpoint", accel::text::plural(static_cast<long long>(in.checkpoint.tensor_names.size()), "tensor") +
                         " (names and sizes digest " + digest(tensors) + ")"},
      {"config.json", dims}};
  if (args.stages > 1) {
    shared.emplace_back("--max-memory", args.max_memory.value_or("(measured by the main process)"));
    shared.emplace_back("--device-map", args.device_map);
    shared.emplace_back("--objective", std::string(accel::plan_objective_name(args.objective)));
    shared.emplace_back("--dtype", args.dtype.value_or("(config.json's)"));
  }
  return shared;
}

// The processes of a job agree before any starts working: each checked its inputs, and each learns
// whether any refused them and whether all were given the same `shared` inputs. A process that
// refused prints its refusal first, then takes part, then ends with its refusal's status; the others
// end with the first refusing process's status, naming it. Where none refused but one was given
// other inputs than process 0 (another --prompts file, --new-tokens, checkpoint or budgets on one
// machine), every process names the first difference and ends with status 2: the stages would
// otherwise wait for steps that never come, or compute another prompt's tokens. So no process goes
// on to load and then waits for one that has left. A refusal is printed before the gather and a
// difference by every process after it, so whichever process ends first has said why, and the
// launcher's stopping of the rest cannot leave the job without its reason. Returns the exit status
// to end with (0: go on).
int agree(accel::DistributedState& state, std::exception_ptr refused, const SharedInputs& shared = {}) {
  if (!state.use_distributed()) {
    if (refused) std::rethrow_exception(refused);
    return 0;
  }
  std::pair<int, std::string> mine{0, ""};
  if (refused) {
    try {
      std::rethrow_exception(refused);
    } catch (const accel::error& e) {
      mine = {exit_code_for(e), e.what()};
      std::fprintf(stderr, "%s\n", e.what());
      std::fflush(stderr);
    }
  }
  const auto all = accel::gather_object(state, std::make_pair(mine, shared));
  if (refused) return mine.first;
  for (std::size_t rank = 0; rank < all.size(); ++rank)
    if (all[rank].first.first != 0) {
      std::fprintf(stderr, "llama_generate: process %zu refused its inputs (%s); this one stops too\n", rank,
                   all[rank].first.second.c_str());
      return all[rank].first.first;
    }
  const SharedInputs& first = all.front().second;
  for (std::size_t rank = 1; rank < all.size(); ++rank)
    for (std::size_t i = 0; i < first.size() && i < all[rank].second.size(); ++i)
      if (all[rank].second[i] != first[i]) {
        std::fprintf(stderr,
                     "[accel.usage] llama_generate: the job's processes were given different inputs: process %zu's %s: %s; process "
                     "0's: %s; start every process with the same options and files\n",
                     rank, first[i].first.c_str(), all[rank].second[i].second.c_str(), first[i].second.c_str());
        return 2;
      }
  return 0;
}

// The main process prints every prompt's line, the statistics (with a pipeline's `reports`) and the
// check; every process returns the check's status (each decides alike from the same gathered results).
int finish(const Args& args, const accel::DistributedState& state, const Inputs& in, const std::vector<PromptResult>& results,
           double seconds, const std::string& job, const std::vector<StageReport>* reports = nullptr) {
  const Check check = in.golden ? check_results(in.prompts, results, *in.golden, in.expected, in.new_tokens, args.tolerance) : Check{true, ""};
  if (state.is_main_process()) {
    for (std::size_t i = 0; i < in.prompts.size(); ++i)
      std::printf("prompt %s -> tokens %s\n", join(in.prompts[i].ids).c_str(), join(results[i].tokens).c_str());
    if (!args.quiet) print_stats(in.prompts, results, seconds, job, reports != nullptr);
    if (!args.quiet && reports) {
      std::uint64_t model_bytes = 0;
      for (const std::string_view name : in.checkpoint.tensor_names) model_bytes += in.checkpoint.entry(*in.checkpoint.find(name)).size_bytes();
      print_stage_reports(*reports, model_bytes);
    }
    if (in.golden) std::printf("%s\n", check.line.c_str());
    std::fflush(stdout);
  }
  return check.ok ? 0 : 1;
}

// R replicas of S stages (process = replica x S + stage): each process loads its stage of the model
// (load_stage of the plan every process computes alike) and runs it over its replica's prompts
// (generate_pipelined); the first stages' results are gathered to every process in prompt order.
int run_pipelined(const Args& args, accel::DistributedState& state, const Inputs& in) {
  const auto stages = static_cast<int>(args.stages), replicas = state.num_processes() / stages;
  const accel::GridGroups grid = accel::grid_groups(state, replicas, stages);
  // Every process plans alike, so a plan it refuses (more stages than the model has parts, budgets
  // too small) is refused by all, before any loads.
  accel::PipelineLoadPlan plan;
  std::vector<StageRole> roles;
  std::exception_ptr refused;
  try {
    plan = plan_stages(args, in.checkpoint, state);
    roles = stage_roles(plan, in.config);
  } catch (const accel::error&) {
    refused = std::current_exception();
  }
  if (const int status = agree(state, refused)) return status;
  accel::DispatchedModel model = accel::load_stage(in.checkpoint, plan, grid.stage);
  if (!args.quiet && state.is_main_process()) {
    print_pipeline(args, plan, roles, static_cast<std::size_t>(replicas));
    std::fflush(stdout);  // before generating: a watcher sees the job reached its stages
  }

  HostViews views(plan.load.devices.value_or(std::vector<accel::DeviceMemoryPtr>{}), args.copy_back);
  Decoder decoder(model, in.config, views);
  const accel::Shard shard =
      accel::split_between_processes(in.prompts, static_cast<std::size_t>(grid.replica), static_cast<std::size_t>(replicas)).shard();
  const std::span<const Prompt> mine(in.prompts.data() + shard.first_index, shard.real_count);
  std::vector<const GoldenRun*> expected;
  for (std::size_t i = shard.first_index; i < shard.first_index + shard.real_count; ++i)
    expected.push_back(in.golden ? &in.golden->runs[in.expected[i]] : nullptr);
  StageReport report{static_cast<std::size_t>(grid.replica), static_cast<std::size_t>(grid.stage), roles[static_cast<std::size_t>(grid.stage)].describe()};
  for (const auto& [where, totals] : model.report().per_placement) (where.is_disk() ? report.disk_bytes : report.weight_bytes) += totals.bytes;

  const std::vector<accel::DeviceMemoryPtr>& gpus = views.devices();
  if (grid.stage_group->device_buffers() && gpus.empty())
    throw std::logic_error("the stage group's communicator takes device memory, but this process plans on no GPU");
  StageLink link(*grid.stage_group, grid.stage_group->device_buffers() || (args.copy_back && !gpus.empty()) ? gpus.front() : nullptr);

  accel::wait_for_everyone(state);  // time the generation, not the loads
  const auto start = std::chrono::steady_clock::now();
  const std::vector<PromptResult> done =
      generate_pipelined(decoder, in.config, roles[static_cast<std::size_t>(grid.stage)], link, mine, in.new_tokens, expected, report);
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The first stages hold the results, replica after replica: in rank order, prompt order.
  std::vector<PromptResult> results;
  for (auto& part : accel::gather_object(state, done)) results.insert(results.end(), part.begin(), part.end());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<StageReport> reports = accel::gather_object(state, report);
  if (results.size() != in.prompts.size())  // every replica's first stage returns its whole share
    throw std::logic_error("the replicas returned " + std::to_string(results.size()) + " results for " +
                           std::to_string(in.prompts.size()) + " prompts");
  return finish(args, state, in, results, seconds, accel::text::plural(replicas, "replica") + " x " + accel::text::plural(stages, "stage"),
                &reports);
}

int run(const Args& args) {
  // The job: P processes are R replicas of S stages (process = replica × S + stage).
  accel::StateOptions state_options;
  state_options.cpu = args.no_gpu || args.simulate_gpus.has_value();  // simulated GPUs are the process's own
  accel::DistributedState state(state_options);
  const auto processes = static_cast<std::size_t>(state.num_processes());
  Inputs in;
  std::exception_ptr refused;
  SharedInputs shared;
  try {
    in = check_inputs(args, processes);
    shared = shared_inputs(args, in);
  } catch (const accel::error&) {
    refused = std::current_exception();
  }
  if (const int status = agree(state, refused, shared)) return status;
  if (args.stages > 1) return run_pipelined(args, state, in);

  // Each replica takes a contiguous share of the prompts, plans and loads its own copy on its own
  // devices.
  const std::size_t replicas = processes;
  const std::size_t replica = static_cast<std::size_t>(state.process_index());
  const accel::Shard shard = accel::split_between_processes(in.prompts, replica, replicas).shard();
  const accel::AutoDispatchPlan plan = plan_load(args, in.checkpoint, state);
  accel::DispatchedModel model = accel::load_checkpoint_and_dispatch(in.checkpoint, plan.plan.device_map, plan.load);
  if (!args.quiet && state.is_main_process()) print_placement(args, plan, model, replicas);

  HostViews views(plan.load.devices.value_or(std::vector<accel::DeviceMemoryPtr>{}), args.copy_back);
  Decoder decoder(model, in.config, views);
  if (state.use_distributed()) accel::wait_for_everyone(state);  // time the generation, not the loads
  const auto start = std::chrono::steady_clock::now();
  std::vector<PromptResult> mine;
  for (std::size_t i = shard.first_index; i < shard.first_index + shard.real_count; ++i)
    mine.push_back(generate(decoder, in.config, in.prompts[i], in.new_tokens, in.golden ? &in.golden->runs[in.expected[i]] : nullptr));
  // Every prompt's result on every process, in prompt order.
  const std::vector<PromptResult> results = state.use_distributed() ? accel::gather_object(state, mine, shard) : std::move(mine);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return finish(args, state, in, results, seconds, std::to_string(replicas) + (replicas == 1 ? " replica" : " replicas"));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const accel::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return exit_code_for(e);
  } catch (const std::exception& e) {  // not one of the refusals above: a bug (docs/exit-codes.md)
    std::fprintf(stderr, "llama_generate: unexpected error (a bug, please report it): %s\n", e.what());
    return 70;
  }
}
