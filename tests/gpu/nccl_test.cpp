// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// NCCL on a real GPU (world size 1: NCCL refuses two ranks on one GPU before 2.30). Hidden tag
// [.gpu]; tests/gpu/run.sh runs it on the GPU machine.
#include <accel/comm/collectives.hpp>
#include <accel/comm/p2p.hpp>

#include <cuda_runtime_api.h>

#include <span>
#include <string>
#include <vector>

#include "support/catch.hpp"

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
