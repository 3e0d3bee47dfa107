// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// gather_object latency/throughput, barrier latency and all_reduce (float32, in place, sum) between
// real processes on the CPU backend.
//
//   collectives_bench [--procs 2,4] [--quick]
//       [--case raw_bytes|raw_bytes_into|struct_list|struct_fields|records_fields|records_fields_fresh|records_flat|records_flat_into|records_cbor|barrier|all_reduce] [--size BYTES]
//
// --case and --size (each repeatable) run only those cases and payload sizes (for profiling one).
// --quick runs a tenth of the iterations.
// The parent hosts the job's store (as accel launch does) and starts N copies of itself as ranks;
// rank 0 prints one CSV line per case: impl,case,procs,payload_bytes,iters,mean_us,MB_per_s,median_us,p90_us
// (MB/s = bytes every rank receives per gather / mean time; for all_reduce, the buffer's bytes /
// median time; median and p90 over the iterations as rank 0 timed each). benchmarks/compare/torch_gather.py
// runs this and torch.distributed's all_gather_object on gloo with the same payloads.
#include <accel/comm/collectives.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

extern "C" char** environ;

namespace {

// The struct-list payload: what a generation step might return per prompt (~70 bytes in CBOR).
struct Item {
  int id = 0;
  double score = 0;
  std::string text;
  std::vector<int> tokens;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Item, id, score, text, tokens)

// The same item declared with ACCEL_DEFINE_FIELDS: the binary field encoding instead of CBOR.
struct FieldsItem {
  int id = 0;
  double score = 0;
  std::string text;
  std::vector<int> tokens;
};
ACCEL_DEFINE_FIELDS(FieldsItem, id, score, text, tokens)

constexpr std::size_t item_bytes = 70;  // keep in step with torch_gather.py's item

// The records of the struct-gather goal: {int64 id, float score, ~34-char string, 4 int32 tokens},
// declared (binary field encoding) and through nlohmann (CBOR); torch sends the same tuples.
struct Record {
  std::int64_t id = 0;
  float score = 0;
  std::string text;
  std::vector<std::int32_t> tokens;
};
ACCEL_DEFINE_FIELDS(Record, id, score, text, tokens)
struct CborRecord {
  std::int64_t id = 0;
  float score = 0;
  std::string text;
  std::vector<std::int32_t> tokens;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CborRecord, id, score, text, tokens)

template <class R>
std::vector<R> make_records(std::size_t n, int rank) {
  std::vector<R> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::int32_t>(i);
    v[i] = {static_cast<std::int64_t>(i), 0.5f * static_cast<float>(k), "completion text for prompt " + std::to_string(rank * 1000000 + k),
            {1, 2, 3, k}};
  }
  return v;
}

template <class I = Item>
std::vector<I> make_items(std::size_t bytes, int rank) {
  std::vector<I> v(std::max<std::size_t>(1, bytes / item_bytes));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = {static_cast<int>(i), 0.5 * static_cast<double>(i), "completion text for prompt " + std::to_string(rank * 1000000 + static_cast<int>(i)),
            {1, 2, 3, static_cast<int>(i)}};
  return v;
}

int iterations(std::size_t bytes, bool structs, bool quick) {
  int n = bytes <= 1024 ? 400 : bytes <= (1u << 20) ? 100 : 5;
  if (structs) n = bytes <= 1024 ? 200 : bytes <= 65536 ? 30 : bytes <= (1u << 20) ? 3 : 1;
  return quick ? std::max(1, n / 10) : n;
}

struct Stats {
  double mean = 0, median = 0, p90 = 0;
};

template <class F>
Stats time_us(accel::DistributedState& state, int iters, F&& op) {
  op();  // warm-up (first-touch of buffers and segments)
  accel::wait_for_everyone(state);
  std::vector<double> each;
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  for (int i = 0; i < iters; ++i) {
    op();
    const auto now = std::chrono::steady_clock::now();
    each.push_back(std::chrono::duration<double, std::micro>(now - last).count());
    last = now;
  }
  Stats s;
  s.mean = std::chrono::duration<double, std::micro>(last - t0).count() / iters;
  std::sort(each.begin(), each.end());
  s.median = each[each.size() / 2];
  s.p90 = each[std::min(each.size() - 1, static_cast<std::size_t>(0.9 * static_cast<double>(each.size())))];
  return s;
}

struct Filter {
  std::vector<std::string> cases;
  std::vector<std::size_t> sizes;
  bool wants(const std::string& c, std::size_t bytes) const {
    const bool case_ok = cases.empty() || std::find(cases.begin(), cases.end(), c) != cases.end();
    const bool size_ok = c == "barrier" || sizes.empty() || std::find(sizes.begin(), sizes.end(), bytes) != sizes.end();
    return case_ok && size_ok;
  }
};

int worker(bool quick, const Filter& only) {
  accel::DistributedState state;
  const int n = state.num_processes(), rank = state.process_index();
  auto report = [&](const char* name, std::size_t bytes, int iters, Stats t, double mb_per_s) {
    if (rank == 0) std::printf("accel,%s,%d,%zu,%d,%.1f,%.1f,%.1f,%.1f\n", name, n, bytes, iters, t.mean, mb_per_s, t.median, t.p90);
    std::fflush(stdout);
  };
  const int barrier_iters = quick ? 100 : 1000;
  if (only.wants("barrier", 0))
    report("barrier", 0, barrier_iters, time_us(state, barrier_iters, [&] { accel::wait_for_everyone(state); }), 0);
  // One gather case: the value is made only when the case runs; every call checks what came back.
  auto run_case = [&](const char* name, std::size_t bytes, bool cbor_structs, auto make) {
    if (!only.wants(name, bytes)) return;
    const auto value = make();
    const int iters = iterations(bytes, cbor_structs, quick);
    const Stats t = time_us(state, iters, [&] {
      auto all = accel::gather_object(state, value);
      if (all.size() != static_cast<std::size_t>(n) || all.back().size() != value.size()) std::abort();
    });
    report(name, bytes, iters, t, static_cast<double>(bytes) * n / t.mean);  // every rank receives n payloads
  };
  for (std::size_t bytes : {std::size_t{100}, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
    run_case("raw_bytes", bytes, false, [&] { return std::vector<std::uint8_t>(bytes, static_cast<std::uint8_t>(rank)); });
    if (only.wants("raw_bytes_into", bytes)) {  // the same through gather_object_into, reusing its result
      const std::vector<std::uint8_t> value(bytes, static_cast<std::uint8_t>(rank));
      std::vector<std::vector<std::uint8_t>> all;
      const int iters = iterations(bytes, false, quick);
      const Stats t = time_us(state, iters, [&] {
        accel::gather_object_into(state, value, all);
        if (all.size() != static_cast<std::size_t>(n) || all.back().size() != bytes || all.back().back() != n - 1) std::abort();
      });
      report("raw_bytes_into", bytes, iters, t, static_cast<double>(bytes) * n / t.mean);
    }
    run_case("struct_list", bytes, true, [&] { return make_items(bytes, rank); });
    run_case("struct_fields", bytes, false, [&] { return make_items<FieldsItem>(bytes, rank); });
  }
  // Records (payload column: records per process): gather_object_into reusing its result across
  // calls, gather_object into fresh results, and the CBOR-encoded records.
  for (std::size_t count : {std::size_t{1000}, std::size_t{100000}}) {
    const int iters = quick ? 5 : count <= 1000 ? 200 : 20;
    if (only.wants("records_fields", count)) {
      const auto value = make_records<Record>(count, rank);
      std::vector<std::vector<Record>> all;
      const Stats t = time_us(state, iters, [&] {
        accel::gather_object_into(state, value, all);
        if (all.size() != static_cast<std::size_t>(n) || all.back().size() != count) std::abort();
      });
      report("records_fields", count, iters, t, 0);
    }
    if (only.wants("records_fields_fresh", count)) {
      const auto value = make_records<Record>(count, rank);
      const Stats t = time_us(state, iters, [&] {
        auto all = accel::gather_object(state, value);
        if (all.size() != static_cast<std::size_t>(n) || all.back().size() != count) std::abort();
      });
      report("records_fields_fresh", count, iters, t, 0);
    }
    // gather_object_flat (accelerate's gather_object on lists): one vector of every rank's records,
    // fresh each call, and gather_object_flat_into reusing its result.
    if (only.wants("records_flat", count)) {
      const auto value = make_records<Record>(count, rank);
      const Stats t = time_us(state, iters, [&] {
        auto all = accel::gather_object_flat(state, value);
        if (all.size() != count * static_cast<std::size_t>(n)) std::abort();
      });
      report("records_flat", count, iters, t, 0);
    }
    if (only.wants("records_flat_into", count)) {
      const auto value = make_records<Record>(count, rank);
      std::vector<Record> all;
      const Stats t = time_us(state, iters, [&] {
        accel::gather_object_flat_into(state, value, all);
        if (all.size() != count * static_cast<std::size_t>(n)) std::abort();
      });
      report("records_flat_into", count, iters, t, 0);
    }
    if (only.wants("records_cbor", count)) {
      const auto value = make_records<CborRecord>(count, rank);
      const int cbor_iters = quick ? 2 : count <= 1000 ? 200 : 5;
      const Stats t = time_us(state, cbor_iters, [&] {
        auto all = accel::gather_object(state, value);
        if (all.size() != static_cast<std::size_t>(n) || all.back().size() != count) std::abort();
      });
      report("records_cbor", count, cbor_iters, t, 0);
    }
  }
  // all_reduce: float32 sum in place; the warm-up call is checked (rank r contributes r + 1).
  for (std::size_t bytes : {std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20}) {
    if (!only.wants("all_reduce", bytes)) continue;
    std::vector<float> data(bytes / sizeof(float), static_cast<float>(rank + 1));
    bool first = true;
    const int iters = quick ? 5 : bytes <= (1u << 20) ? 100 : bytes <= (16u << 20) ? 30 : 15;
    const Stats t = time_us(state, iters, [&] {
      accel::all_reduce(state, std::span(data), accel::ReduceOp::sum);
      if (first && (data.front() != static_cast<float>(n * (n + 1) / 2) || data.back() != data.front())) {
        std::fprintf(stderr, "all_reduce returned %g, expected %d\n", static_cast<double>(data.front()), n * (n + 1) / 2);
        std::abort();
      }
      if (first) std::fill(data.begin(), data.end(), 0.0f);  // keep the timed sums finite
      first = false;
    });
    report("all_reduce", bytes, iters, t, static_cast<double>(bytes) / t.median);
  }
  return 0;
}

int run_job(const char* self, int procs, bool quick, const std::vector<std::string>& filter_args) {
  accel::StoreServerOptions o;
  o.world_size = procs;
  accel::StoreServer store("127.0.0.1", 0, "bench-token", o);
  std::vector<pid_t> pids;
  for (int r = 0; r < procs; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    for (const auto& kv : std::vector<std::string>{
             "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(procs), "LOCAL_RANK=" + std::to_string(r),
             "LOCAL_WORLD_SIZE=" + std::to_string(procs), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1", "ACCEL_USE_CPU=1",
             "ACCEL_STORE=" + store.address(), "ACCEL_JOB_TOKEN=bench-token", "ACCEL_TIMEOUT_S=600"})
      env.push_back(kv);
    std::vector<char*> e;
    for (auto& s : env) e.push_back(s.data());
    e.push_back(nullptr);
    std::vector<std::string> args = {self, "--worker", quick ? "--quick" : "--full"};
    args.insert(args.end(), filter_args.begin(), filter_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, self, nullptr, nullptr, argv.data(), e.data()) != 0) return 1;
    pids.push_back(pid);
  }
  int rc = 0;
  for (auto pid : pids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, is_worker = false;
  std::vector<int> procs = {2, 4};
  Filter only;
  std::vector<std::string> filter_args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--worker") is_worker = true;
    else if ((a == "--case" || a == "--size") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--case") only.cases.push_back(v);
      else only.sizes.push_back(std::strtoull(v.c_str(), nullptr, 10));
      filter_args.insert(filter_args.end(), {a, v});
    }
    else if (a == "--quick") quick = true;
    else if (a == "--procs" && i + 1 < argc) {
      procs.clear();
      for (const char* p = argv[++i]; *p;) {
        procs.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    }
  }
  try {
    if (is_worker) return worker(quick, only);
    char self[4096] = {};
    if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) std::strncpy(self, argv[0], sizeof self - 1);
    std::printf("impl,case,procs,payload_bytes,iters,mean_us,MB_per_s,median_us,p90_us\n");
    std::fflush(stdout);
    for (int p : procs)
      if (run_job(self, p, quick, filter_args) != 0) return 1;
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "collectives_bench: %s\n", e.what());
    return 1;
  }
}
