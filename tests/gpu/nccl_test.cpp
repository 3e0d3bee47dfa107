// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// NCCL on a real GPU (world size 1: NCCL refuses two ranks on one GPU before 2.30). Hidden tag
// [.gpu]; tests/gpu/run.sh runs it on the GPU machine.
#include <accel/comm/collectives.hpp>
#include <accel/comm/p2p.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/store_log.hpp"

namespace {
struct Completion {
  int prompt = 0;
  std::string text;
  std::vector<float> logprobs;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Completion, prompt, text, logprobs)
}  // namespace

TEST_CASE("gpu: an NCCL communicator of one rank moves bytes through the GPU", "[.gpu][gpu][nccl]") {
  accel::NcclCommunicator comm(nullptr, 0, 1, 0, std::chrono::seconds(60));
  REQUIRE(comm.backend() == "nccl");
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{16} << 20}) {
    std::vector<std::byte> data(size);
    for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>(i * 7 % 251);
    const auto all = comm.all_gather("bytes", data);
    REQUIRE(all.size() == 1);
    REQUIRE(all[0].size() == size);
    REQUIRE(std::equal(all[0].begin(), all[0].end(), data.begin(), data.end()));
  }
  REQUIRE(comm.broadcast("b", std::vector<std::byte>(3, std::byte{5}), 0) == std::vector<std::byte>(3, std::byte{5}));
  comm.barrier();
  REQUIRE(comm.collectives_entered() == 6);
}

TEST_CASE("gpu: gather_object and broadcast_object run through NCCL", "[.gpu][gpu][nccl]") {
  accel::NcclCommunicator comm(nullptr, 0, 1, 0, std::chrono::seconds(60));
  const std::vector<Completion> mine = {{0, "zero", {0.5f}}, {1, "one", {}}};
  const auto all = accel::gather_object(comm, mine);
  REQUIRE(all.size() == 1);
  REQUIRE(all[0].size() == 2);
  REQUIRE(all[0][1].text == "one");
  REQUIRE(accel::gather_object_flat(comm, std::vector<int>{1, 2, 3}) == std::vector<int>{1, 2, 3});
  REQUIRE(accel::broadcast_object(comm, std::string("hello"), 0) == "hello");
  const auto shard = accel::shard_for(3, 0, 1);
  REQUIRE(accel::gather_object(comm, std::vector<std::string>{"a", "b", "c"}, shard) == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("gpu: a DistributedState on a GPU can use the NCCL backend", "[.gpu][gpu][nccl]") {
  accel::DistributedState state;
  REQUIRE(state.device().is_cuda());
  accel::CommOptions options;
  options.backend = accel::CommBackend::nccl;
  auto& comm = accel::init_communicator(state, options);
  REQUIRE(comm.backend() == "nccl");
  REQUIRE(accel::gather_object(state, 42) == std::vector<int>{42});
  accel::wait_for_everyone(state);
}

TEST_CASE("gpu: a failing local step still completes the NCCL round and rethrows", "[.gpu][gpu][nccl]") {
  accel::NcclCommunicator comm(nullptr, 0, 1, 0, std::chrono::seconds(60));
  auto failure = std::make_exception_ptr(accel::serialization_error("cannot encode"));
  REQUIRE_THROWS_WITH(comm.all_gather("gather_object", {}, failure), accel_test::contains("cannot encode"));
  // The communicator stays usable afterwards.
  REQUIRE(accel::gather_object(comm, 7) == std::vector<int>{7});
}

// Two NCCL ranks cannot share this machine's one GPU before NCCL 2.30, so the transfer itself is
// not run here: the checks that come before it (self, out of range) must hold on the device path.
TEST_CASE("gpu: point-to-point on a one-rank NCCL communicator refuses itself and absent ranks, moving nothing", "[.gpu][gpu][nccl][p2p]") {
  accel::NcclCommunicator comm(nullptr, 0, 1, 0, std::chrono::seconds(60));
  void* raw = nullptr;
  REQUIRE(cudaMalloc(&raw, 4 * sizeof(float)) == cudaSuccess);
  const std::span<float> device(static_cast<float*>(raw), 4);
  REQUIRE_THROWS_AS(accel::send(comm, device, 0), accel::usage_error);
  REQUIRE_THROWS_AS(accel::recv(comm, device, 1), accel::usage_error);
  REQUIRE_THROWS_AS(accel::send_object(comm, std::string("x"), 2), accel::usage_error);
  REQUIRE(cudaFree(raw) == cudaSuccess);
  REQUIRE(accel::gather_object(comm, 1) == std::vector<int>{1});  // the communicator is unharmed
}

// Two ranks as threads of this process, each on a GPU of its own (NCCL refuses two ranks on one
// GPU before 2.30): spans both ways, stream-less, on a caller's stream, and a send_async beside a
// recv between the same pair at once with 64 MiB each way (past NCCL's buffers: with both
// directions on one NCCL communicator each rank's send kernel would wait in front of its receive).
TEST_CASE("gpu: point-to-point between two GPUs: both directions at once, stream-less and on the caller's stream",
          "[.gpu][gpu][nccl][p2p]") {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0, (void)cudaGetLastError();
  if (gpus < 2) {
    WARN("test skipped: a 2-rank NCCL send/recv needs 2 GPUs, this machine has " << gpus);
    return;
  }
  accel_test::LocalStore job;
  std::shared_ptr<accel::StoreClient> clients[2] = {job.client(0, 2, std::chrono::seconds(60)), job.client(1, 2, std::chrono::seconds(60))};
  constexpr std::size_t n = std::size_t{16} << 20;  // floats: 64 MiB
  // One rank's part; what went wrong ("" for nothing): Catch2's assertions are for the main thread.
  auto rank_body = [&](int r) -> std::string {
    if (cudaSetDevice(r) != cudaSuccess) return "cudaSetDevice failed";
    accel::NcclCommunicator comm(clients[r], r, 2, r, std::chrono::seconds(60));
    const int peer = 1 - r;
    float* mine = nullptr;
    float* theirs = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&mine), n * sizeof(float)) != cudaSuccess ||
        cudaMalloc(reinterpret_cast<void**>(&theirs), n * sizeof(float)) != cudaSuccess)
      return "cudaMalloc failed";
    std::vector<float> host(n, static_cast<float>(r + 1));
    if (cudaMemcpy(mine, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) return "cudaMemcpy failed";
    const std::span<float> out(mine, n), in(theirs, n);
    // Both directions at once, stream-less.
    auto h = accel::send_async(comm, out, peer);
    accel::recv(comm, in, peer);
    h.wait();
    std::vector<float> got(n);
    if (cudaMemcpy(got.data(), theirs, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return "cudaMemcpy back failed";
    if (got.front() != static_cast<float>(peer + 1) || got.back() != static_cast<float>(peer + 1)) return "wrong data, stream-less";
    // On a caller's streams (one per direction): enqueued, then waited for by the caller.
    cudaStream_t sends = nullptr, recvs = nullptr;
    if (cudaStreamCreate(&sends) != cudaSuccess || cudaStreamCreate(&recvs) != cudaSuccess) return "cudaStreamCreate failed";
    if (cudaMemset(theirs, 0, n * sizeof(float)) != cudaSuccess) return "cudaMemset failed";
    auto s = accel::send_async(comm, out.first(1000), peer, sends);
    accel::recv(comm, in.first(1000), peer, recvs);
    s.wait();
    if (cudaStreamSynchronize(recvs) != cudaSuccess) return "cudaStreamSynchronize failed";
    if (cudaMemcpy(got.data(), theirs, 1000 * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return "cudaMemcpy back failed";
    if (got[0] != static_cast<float>(peer + 1) || got[999] != static_cast<float>(peer + 1)) return "wrong data on the caller's stream";
    (void)cudaStreamDestroy(sends), (void)cudaStreamDestroy(recvs);
    (void)cudaFree(mine), (void)cudaFree(theirs);
    return "";
  };
  auto rank = [&](int r) -> std::string {
    try {
      return rank_body(r);
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  const auto start = std::chrono::steady_clock::now();
  auto r0 = std::async(std::launch::async, rank, 0);
  const std::string e1 = rank(1);
  const std::string e0 = r0.get();
  CHECK(e0 == std::string());
  CHECK(e1 == std::string());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
}
