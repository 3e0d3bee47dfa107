// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The seed program: each process prints its state, takes its share of the prompts, "processes"
// them (deterministic work on the CPU; a round trip through its own GPU when it has one), and the
// main process prints every prompt's result in the original order, gathered from all processes.
//
//   accel launch --num_processes 2 ./infer_split_gather
#include <accel/comm/collectives.hpp>
#include <accel/state.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#if ACCEL_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

namespace {

// Stand-in for a model: a deterministic digest of the prompt, so every run prints the same results.
std::string complete(const std::string& prompt, const accel::Device& device) {
  std::string text = prompt;
#if ACCEL_HAS_CUDA()
  if (device.is_cuda()) {  // the prompt travels through this process's own GPU and back
    void* buf = nullptr;
    if (cudaMalloc(&buf, text.size()) == cudaSuccess) {
      cudaMemcpy(buf, text.data(), text.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(text.data(), buf, text.size(), cudaMemcpyDeviceToHost);
      cudaFree(buf);
    }
  }
#else
  (void)device;
#endif
  std::uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return prompt + " -> " + std::to_string(h % 10000);
}

}  // namespace

int main() {
  try {
    accel::DistributedState state;
    const std::vector<std::string> prompts = {"the sky is", "two plus two", "hello", "once upon a time",
                                              "a haiku about GPUs", "the capital of France", "why is the sea salty"};
    auto mine = state.split_between_processes(prompts);
    std::printf("%s handles prompts %zu..%zu of %zu\n", state.to_string().c_str(), mine.shard().first_index,
                mine.shard().first_index + mine.shard().real_count, prompts.size());
    std::vector<std::string> results;
    for (const auto& p : mine) {
      results.push_back(complete(p, state.device()));
      std::printf("rank %d: %s\n", state.process_index(), results.back().c_str());
    }
    std::fflush(stdout);
    // Collective: every process contributes its share; padding is dropped and input order restored.
    const auto all = accel::gather_object(state, results, mine.shard());
    accel::print(state, "all ", all.size(), " results, in input order:");
    for (std::size_t i = 0; i < all.size(); ++i) accel::print(state, "  ", i, ". ", all[i]);
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "infer_split_gather: %s\n", e.what());
    return 1;
  }
}
