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
//   llama_generate --checkpoint DIR --prompt 1,17,254 --new-tokens 8
//   llama_generate --checkpoint tests/compat/fixtures/forward/llama --simulate-gpus 1MiB,1MiB
//       --max-memory 0=300KiB,1=300KiB,cpu=400KiB --expect tests/compat/fixtures/forward/llama/golden.json
#include <accel/load/auto_dispatch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage = R"(usage: llama_generate --checkpoint DIR [options]

Greedy decoding with a Llama-architecture model (config.json + safetensors) placed and loaded by accel.

  --checkpoint DIR        the model folder (config.json, *.safetensors, index)
  --prompt IDS            prompt token ids, comma-separated (default: the --expect file's prompt)
  --new-tokens N          tokens to generate (default: the --expect file's count, else 8)
  --max-memory SPEC       budgets as accel plan takes them ('0=2GiB,1=2GiB,cpu=8GiB'); default: measured
  --simulate-gpus SIZES   host-simulated GPUs of these sizes ('1MiB,1MiB') instead of CUDA
  --no-gpu                no GPU at all, even where CUDA has some: CPU and disk only
  --device-map MODE       auto | balanced | balanced_low_0 | sequential (default auto)
  --objective fit|speed   fit: transformers' map (default); speed: the fewest weight bytes streamed
                          per forward pass within the same budgets
  --dtype DTYPE           load dtype of floating tensors: float32, bfloat16, float16 (default: config.json's)
  --offload-folder DIR    where converted disk tensors go (needed when --dtype changes a disk tensor)
  --copy-back             read every device tensor through a copy to the host, as with a real GPU
  --expect FILE           golden.json from tests/compat/gen_forward.py: exit 1 unless the tokens are
                          identical and every step's logits are within --tolerance (relative to the
                          step's largest logit)
  --tolerance X           default 1e-3
  --quiet                 print only the tokens and the check
  --help                  this text
)";

struct Args {
  std::string checkpoint;
  std::vector<std::int64_t> prompt;
  std::optional<int> new_tokens;
  std::optional<std::string> max_memory, simulate_gpus, dtype, offload_folder, expect;
  std::string device_map = "auto";
  accel::PlanObjective objective = accel::PlanObjective::fit;
  double tolerance = 1e-3;
  bool copy_back = false, quiet = false, no_gpu = false;
};

[[noreturn]] void fail(const std::string& what) { throw accel::usage_error("llama_generate: " + what); }

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::string piece;
  std::istringstream in{std::string(text)};
  while (std::getline(in, piece, sep))
    if (!piece.empty()) out.push_back(piece);
  return out;
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
    if (i + 1 >= argc) fail(std::string(opt) + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (opt == "--checkpoint") a.checkpoint = value;
    else if (opt == "--prompt") {
      for (const auto& p : split(value, ',')) a.prompt.push_back(std::stoll(p));
      if (a.prompt.empty()) fail("--prompt needs token ids like 1,17,254");
    } else if (opt == "--new-tokens") a.new_tokens = std::stoi(value);
    else if (opt == "--max-memory") a.max_memory = value;
    else if (opt == "--simulate-gpus") a.simulate_gpus = value;
    else if (opt == "--device-map") a.device_map = value;
    else if (opt == "--objective") a.objective = accel::parse_plan_objective(value);
    else if (opt == "--dtype") a.dtype = value;
    else if (opt == "--offload-folder") a.offload_folder = value;
    else if (opt == "--expect") a.expect = value;
    else if (opt == "--tolerance") a.tolerance = std::stod(value);
    else fail("unknown option '" + std::string(opt) + "' (see --help)");
  }
  if (a.checkpoint.empty()) fail("--checkpoint DIR is required (see --help)");
  return a;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read " + path.string());
  return nlohmann::json::parse(in);
}

// What the decoder needs from config.json; anything it does not implement is refused by name.
struct LlamaConfig {
  int hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  double eps = 1e-6, rope_theta = 10000;
  bool tied = false;

  static LlamaConfig from_json(const nlohmann::json& j) {
    const auto arch = j.value("architectures", nlohmann::json::array());
    if (arch.empty() || arch[0] != "LlamaForCausalLM")
      fail("config.json's architecture is " + (arch.empty() ? std::string("missing") : arch[0].dump()) +
           "; this example implements LlamaForCausalLM only");
    LlamaConfig c;
    c.hidden = j.at("hidden_size");
    c.intermediate = j.at("intermediate_size");
    c.layers = j.at("num_hidden_layers");
    c.heads = j.at("num_attention_heads");
    c.kv_heads = j.value("num_key_value_heads", c.heads);
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? j["head_dim"].get<int>() : c.hidden / c.heads;
    c.vocab = j.at("vocab_size");
    c.eps = j.value("rms_norm_eps", 1e-6);
    c.tied = j.value("tie_word_embeddings", false);
    const auto rope = j.value("rope_parameters", nlohmann::json::object());
    c.rope_theta = rope.value("rope_theta", j.value("rope_theta", 10000.0));
    const auto rope_type = rope.value("rope_type", std::string("default"));
    if (rope_type != "default") fail("rope_type '" + rope_type + "' is not implemented (default only)");
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) fail("rope_scaling is not implemented");
    if (j.value("hidden_act", std::string("silu")) != "silu") fail("hidden_act must be silu");
    if (j.value("attention_bias", false) || j.value("mlp_bias", false)) fail("attention/MLP biases are not implemented");
    if (c.heads % c.kv_heads != 0) fail("num_attention_heads must be a multiple of num_key_value_heads");
    return c;
  }
};

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
      fail("weights of dtype " + std::string(accel::torch_name(dtype)) + " are not supported (float32, bfloat16, float16)");
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
  if (!t) fail("the checkpoint has no tensor '" + name + "'");
  const auto& h = *t->handle;
  if (h.dtype != accel::DType::F32 && h.dtype != accel::DType::BF16 && h.dtype != accel::DType::F16)
    fail("'" + name + "' is " + std::string(accel::torch_name(h.dtype)) + "; this example reads float32, bfloat16 and float16");
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
void rope(float* v, int head_dim, std::int64_t position, const std::vector<float>& inv_freq) {
  const int half = head_dim / 2;
  for (int j = 0; j < half; ++j) {
    const float angle = static_cast<float>(position) * inv_freq[static_cast<std::size_t>(j)];
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

class Decoder {
 public:
  Decoder(accel::DispatchedModel& model, LlamaConfig config, HostViews& views)
      : model_(model), c_(config), views_(views), k_cache_(static_cast<std::size_t>(c_.layers)),
        v_cache_(static_cast<std::size_t>(c_.layers)) {
    for (int l = 0; l < c_.layers; ++l) order_.push_back("model.layers." + std::to_string(l));
    order_.push_back("model.norm");
    // A tied head is the embedding table itself: streamed whole when it is offloaded.
    head_ = model_.find("lm_head.weight") && model_.find("lm_head.weight")->name == "lm_head.weight" ? "lm_head" : "model.embed_tokens";
    order_.push_back(head_);
    for (int j = 0; j < c_.head_dim / 2; ++j)
      inv_freq_.push_back(static_cast<float>(1.0 / std::pow(c_.rope_theta, 2.0 * j / c_.head_dim)));
  }

  // Runs `ids` (the prompt, or the last token) through the model; returns the last position's logits.
  std::vector<float> step(const std::vector<std::int64_t>& ids, StepStats& stats) {
    const std::size_t n = ids.size(), hidden = static_cast<std::size_t>(c_.hidden);
    std::vector<float> h = embed(ids, stats);
    const bool overlap = model_.fetch_buffer_count() > 1;
    for (std::size_t m = 0; m + 1 < order_.size(); ++m) {
      accel::FetchedModule module = model_.fetch(order_[m]);
      stats.streamed += offloaded_bytes(module);
      if (overlap) model_.prefetch(order_[m + 1]);  // copies while this module computes
      if (m < static_cast<std::size_t>(c_.layers)) {
        layer(static_cast<int>(m), module, h, n);
      } else {  // model.norm: only the last position is needed for the next token
        const auto norm = weight_of(module, "model.norm.weight", views_, model_.execution_device()).to_floats();
        rms_norm(&h[(n - 1) * hidden], norm, c_.eps, &h[(n - 1) * hidden]);
      }
      views_.clear();
    }
    accel::FetchedModule head = model_.fetch(head_);
    stats.streamed += offloaded_bytes(head);
    if (overlap) model_.prefetch(order_.front());  // the next step starts with the first layer
    std::vector<float> logits(static_cast<std::size_t>(c_.vocab));
    weight_of(head, head_ + ".weight", views_, model_.execution_device()).matvec(&h[(n - 1) * hidden], logits.data());
    views_.clear();
    position_ += static_cast<std::int64_t>(n);
    return logits;
  }

 private:
  std::uint64_t offloaded_bytes(const accel::FetchedModule& module) const {
    std::uint64_t bytes = 0;
    if (model_.execution_device())
      for (const auto& t : module.tensors())
        if (t.handle->storage != accel::Storage::device) bytes += t.handle->size_bytes;
    return bytes;
  }

  // The rows of `ids`: read_rows for a table off the GPUs, the resident rows otherwise.
  std::vector<float> embed(const std::vector<std::int64_t>& ids, StepStats& stats) {
    const accel::TensorHandle& table = model_.at("model.embed_tokens.weight");
    const std::size_t hidden = static_cast<std::size_t>(c_.hidden), row = table.size_bytes / static_cast<std::size_t>(table.shape[0]);
    std::vector<std::byte> rows(ids.size() * row);
    if (table.storage != accel::Storage::device) {
      if (const auto gpu = model_.execution_device()) {
        accel::DeviceBuffer buffer(views_.devices().at(static_cast<std::size_t>(*gpu)), rows.size());
        model_.read_rows(table.name, ids, buffer.get());
        std::memcpy(rows.data(), views_.view(buffer.get(), rows.size(), gpu), rows.size());
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

  void layer(int l, const accel::FetchedModule& module, std::vector<float>& h, std::size_t n) {
    const std::string p = order_[static_cast<std::size_t>(l)] + ".";
    const auto gpu = model_.execution_device();
    auto w = [&](const char* name) { return weight_of(module, p + name, views_, gpu); };
    const auto ln1 = w("input_layernorm.weight").to_floats(), ln2 = w("post_attention_layernorm.weight").to_floats();
    const Weight wq = w("self_attn.q_proj.weight"), wk = w("self_attn.k_proj.weight"), wv = w("self_attn.v_proj.weight"),
                 wo = w("self_attn.o_proj.weight"), wg = w("mlp.gate_proj.weight"), wu = w("mlp.up_proj.weight"),
                 wd = w("mlp.down_proj.weight");
    const std::size_t hidden = static_cast<std::size_t>(c_.hidden), hd = static_cast<std::size_t>(c_.head_dim),
                      q_dim = static_cast<std::size_t>(c_.heads) * hd, kv_dim = static_cast<std::size_t>(c_.kv_heads) * hd,
                      inter = static_cast<std::size_t>(c_.intermediate);
    auto& keys = k_cache_[static_cast<std::size_t>(l)];
    auto& values = v_cache_[static_cast<std::size_t>(l)];
    std::vector<float> x(hidden), q(q_dim), k(kv_dim), v(kv_dim), attn(q_dim), o(hidden), g(inter), u(inter), d(hidden);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const std::size_t group = static_cast<std::size_t>(c_.heads / c_.kv_heads);
    for (std::size_t t = 0; t < n; ++t) {
      float* ht = &h[t * hidden];
      const std::int64_t pos = position_ + static_cast<std::int64_t>(t);
      rms_norm(ht, ln1, c_.eps, x.data());
      wq.matvec(x.data(), q.data());
      wk.matvec(x.data(), k.data());
      wv.matvec(x.data(), v.data());
      for (int head = 0; head < c_.heads; ++head) rope(&q[static_cast<std::size_t>(head) * hd], c_.head_dim, pos, inv_freq_);
      for (int head = 0; head < c_.kv_heads; ++head) rope(&k[static_cast<std::size_t>(head) * hd], c_.head_dim, pos, inv_freq_);
      keys.insert(keys.end(), k.begin(), k.end());
      values.insert(values.end(), v.begin(), v.end());
      const std::size_t len = keys.size() / kv_dim;  // causal: this token and every earlier one
      std::vector<float> scores(len);
      for (std::size_t head = 0; head < static_cast<std::size_t>(c_.heads); ++head) {
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
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: [position][kv_heads × head_dim]
  std::int64_t position_ = 0;
};

std::size_t argmax(const std::vector<float>& v) {
  return static_cast<std::size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

std::string join(const std::vector<std::int64_t>& ids) {
  std::string out;
  for (auto id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

int run(const Args& args) {
  std::optional<nlohmann::json> golden;
  if (args.expect) golden = read_json(*args.expect);
  std::vector<std::int64_t> prompt = args.prompt;
  if (prompt.empty() && golden) prompt = golden->at("prompt").get<std::vector<std::int64_t>>();
  if (prompt.empty()) fail("give --prompt (or --expect with a golden file)");
  const int new_tokens = args.new_tokens.value_or(golden ? golden->at("new_tokens").get<int>() : 8);
  const LlamaConfig config = LlamaConfig::from_json(read_json(std::filesystem::path(args.checkpoint) / "config.json"));
  for (auto id : prompt)
    if (id < 0 || id >= config.vocab) fail("prompt token " + std::to_string(id) + " is outside the vocabulary");

  // Plan with accel's defaults for this checkpoint, then load with that plan.
  std::vector<accel::DeviceMemoryPtr> devices;
  if (args.simulate_gpus) {
    std::vector<std::uint64_t> sizes;
    for (const auto& s : split(*args.simulate_gpus, ',')) sizes.push_back(accel::parse_byte_size(s));
    devices = accel::host_simulated_devices(sizes);
  } else if (!args.no_gpu) {
    devices = accel::cuda_device_memories();
  }
  accel::AutoDispatchOptions options;
  options.device_map = args.device_map;
  options.objective = args.objective;
  if (args.max_memory) options.max_memory = accel::parse_max_memory(*args.max_memory);
  options.load.devices = devices;
  options.load.progress = false;
  if (args.dtype) options.load.dtype = accel::dtype_from_string(*args.dtype);
  if (args.offload_folder) options.load.offload_folder = *args.offload_folder;
  const accel::Checkpoint checkpoint = accel::resolve_checkpoint(args.checkpoint);
  const accel::AutoDispatchPlan plan = accel::plan_auto_dispatch(checkpoint, options);
  accel::DispatchedModel model = accel::load_checkpoint_and_dispatch(checkpoint, plan.plan.device_map, plan.load);

  if (!args.quiet) {
    std::printf("placement (%s, objective %s):\n", args.device_map.c_str(),
                std::string(accel::plan_objective_name(args.objective)).c_str());
    std::map<accel::Placement, std::vector<std::string>> keys;
    for (const auto& [key, where] : plan.plan.device_map.entries()) keys[where].push_back(key.empty() ? "(all)" : key);
    for (const auto& [where, names] : keys) {
      const auto& totals = model.report().per_placement.at(where);
      const std::string device = where.is_gpu() ? "cuda:" + std::to_string(where.index) : where.to_string();
      std::printf("  %-6s %8llu bytes  %zu tensors  %s%s\n", device.c_str(),
                  static_cast<unsigned long long>(totals.bytes), totals.tensors, names.front().c_str(),
                  names.size() > 1 ? (" ... " + names.back() + " (" + std::to_string(names.size()) + " keys)").c_str() : "");
    }
    std::printf("fetch buffers: %zu x %llu bytes on %s\n", model.fetch_buffer_count(),
                static_cast<unsigned long long>(model.fetch_buffer_bytes()),
                model.execution_device() ? ("cuda:" + std::to_string(*model.execution_device())).c_str() : "the host (no GPU)");
  }

  HostViews views(devices, args.copy_back);
  Decoder decoder(model, config, views);
  std::vector<std::int64_t> tokens;
  std::vector<std::vector<float>> logits;
  std::vector<StepStats> stats;
  std::vector<std::int64_t> input = prompt;
  for (int s = 0; s < new_tokens; ++s) {
    StepStats st;
    const auto t0 = std::chrono::steady_clock::now();
    logits.push_back(decoder.step(input, st));
    st.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    stats.push_back(st);
    tokens.push_back(static_cast<std::int64_t>(argmax(logits.back())));
    input = {tokens.back()};
  }

  std::printf("prompt %s -> tokens %s\n", join(prompt).c_str(), join(tokens).c_str());
  if (!args.quiet && !stats.empty()) {
    std::vector<double> decode;
    std::uint64_t streamed = 0;
    for (std::size_t s = 1; s < stats.size(); ++s) {
      decode.push_back(stats[s].ms);
      streamed += stats[s].streamed;
    }
    std::sort(decode.begin(), decode.end());
    std::printf("prefill %.2f ms (%zu tokens, %llu bytes streamed); decode median %.2f ms/token (p90 %.2f), "
                "%llu bytes streamed/token\n",
                stats[0].ms, prompt.size(), static_cast<unsigned long long>(stats[0].streamed),
                decode.empty() ? 0.0 : decode[decode.size() / 2], decode.empty() ? 0.0 : decode[decode.size() * 9 / 10],
                static_cast<unsigned long long>(decode.empty() ? 0 : streamed / decode.size()));
  }
  if (!golden) return 0;

  const auto want_tokens = golden->at("tokens").get<std::vector<std::int64_t>>();
  const auto want_logits = golden->at("logits").get<std::vector<std::vector<float>>>();
  double worst = 0;
  std::size_t worst_step = 0;
  for (std::size_t s = 0; s < logits.size() && s < want_logits.size(); ++s) {
    if (want_logits[s].size() != logits[s].size()) fail("the golden file's logits do not match the vocabulary size");
    double scale = 0, diff = 0;
    for (std::size_t i = 0; i < logits[s].size(); ++i) {
      scale = std::max(scale, std::abs(static_cast<double>(want_logits[s][i])));
      diff = std::max(diff, std::abs(static_cast<double>(logits[s][i]) - want_logits[s][i]));
    }
    if (scale > 0 && diff / scale > worst) {
      worst = diff / scale;
      worst_step = s;
    }
  }
  const bool same_tokens = tokens == std::vector<std::int64_t>(want_tokens.begin(), want_tokens.begin() +
                                                                   std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(want_tokens.size()), new_tokens));
  const bool ok = same_tokens && worst <= args.tolerance && static_cast<std::size_t>(new_tokens) <= want_tokens.size();
  std::printf("%s transformers: tokens %s, logits max relative error %.3g (step %zu; tolerance %.3g)\n",
              ok ? "matches" : "DIFFERS FROM", same_tokens ? "identical" : ("expected " + join(want_tokens)).c_str(), worst,
              worst_step, args.tolerance);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
