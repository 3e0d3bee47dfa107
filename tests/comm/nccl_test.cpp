// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The NCCL backend's parts that run without a GPU: padding layout, and clear refusals when NCCL is
// not compiled in or no GPU is visible. Real NCCL runs are in tests/gpu/nccl_test.cpp.
#include <accel/comm/nccl.hpp>

#include <cstdint>
#include <vector>

#include "support/catch.hpp"

TEST_CASE("nccl: variable payloads are padded to the largest, rounded up to 16 bytes", "[nccl]") {
  const std::vector<std::uint64_t> sizes = {3, 100, 0};
  const auto l = accel::detail::padded_layout(sizes);
  REQUIRE(l.chunk == 112);
  REQUIRE(l.total == 336);
  const std::vector<std::uint64_t> none = {0, 0};
  REQUIRE(accel::detail::padded_layout(none).chunk == 0);
  const std::vector<std::uint64_t> exact = {32};
  REQUIRE(accel::detail::padded_layout(exact).chunk == 32);
}

TEST_CASE("nccl: without NCCL or without a GPU the communicator refuses with how to fix it", "[nccl]") {
  if (!accel::nccl_enabled) {
    REQUIRE_THROWS_AS(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)), accel::unavailable_error);
    REQUIRE_THROWS_WITH(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)),
                        accel_test::contains("NCCL is not compiled in; build with -DACCEL_WITH_NCCL=ON"));
    return;
  }
  // This machine has the toolkit but no driver: zero devices.
  int count = 0;
#if ACCEL_HAS_CUDA()
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0, (void)cudaGetLastError();
#endif
  if (count > 0) return;  // a GPU machine: covered by tests/gpu/nccl_test.cpp
  REQUIRE_THROWS_AS(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)), accel::unavailable_error);
  REQUIRE_THROWS_WITH(accel::NcclCommunicator(nullptr, 0, 1, 0, std::chrono::seconds(1)),
                      accel_test::contains("NCCL needs a CUDA device but none is visible to this process; use the CPU backend"));
}

#if ACCEL_HAS_NCCL()
#include <accel/comm/collectives.hpp>
#include <accel/comm/p2p.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "support/store_log.hpp"
#include "support/thread_world.hpp"

// A simulation of the CUDA and NCCL calls the backend makes: host memory stands in for device
// memory, every collective acts as on a one-rank world (recv = send), and every call is logged so
// the tests can check the argument mapping and the order of cleanup without a GPU.
namespace fake {

std::mutex mutex;
std::vector<std::string> calls;
thread_local int current_device = 7;
int next_id = 0;
ncclResult_t collective_result = ncclSuccess;
// What the simulated GPU says about recorded events and the communicator's asynchronous state
// (read by the watchdog thread too).
std::atomic<cudaError_t> event_state{cudaSuccess};
std::atomic<ncclResult_t> async_state{ncclSuccess};

void note(const std::string& s) {
  std::lock_guard lock(mutex);
  calls.push_back(s);
}
std::vector<std::string> take() {
  std::lock_guard lock(mutex);
  return std::exchange(calls, {});
}
std::size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}
std::string ptr(const void* p) { return std::to_string(reinterpret_cast<std::uintptr_t>(p)); }
// Point-to-point: each simulated communicator's unique id, and per id the data sent and not yet
// received, or the receive buffers still waiting for data.
struct Mailbox {
  std::deque<std::vector<std::byte>> messages;
  std::deque<void*> receivers;
};
std::map<ncclComm_t, std::string> comm_ids;
std::map<std::string, Mailbox> mailboxes;

accel::NcclApi api() {
  accel::NcclApi a;
  a.get_device_count = [](int* n) { return *n = 8, cudaSuccess; };
  a.get_device = [](int* d) { return *d = current_device, cudaSuccess; };
  a.set_device = [](int d) { return note("cudaSetDevice " + std::to_string(d)), current_device = d, cudaSuccess; };
  a.get_last_error = [] { return cudaSuccess; };
  a.error_name = [](cudaError_t) { return "cudaErrorFake"; };
  a.error_string = [](cudaError_t) { return "fake"; };
  a.stream_create = [](cudaStream_t* s, unsigned) { return *s = reinterpret_cast<cudaStream_t>(new char), cudaSuccess; };
  a.stream_destroy = [](cudaStream_t s) { return note("cudaStreamDestroy"), delete reinterpret_cast<char*>(s), cudaSuccess; };
  a.stream_query = [](cudaStream_t) { return cudaSuccess; };
  a.event_create = [](cudaEvent_t* e, unsigned) { return *e = reinterpret_cast<cudaEvent_t>(new char), cudaSuccess; };
  a.event_record = [](cudaEvent_t, cudaStream_t s) { return note("cudaEventRecord stream=" + ptr(s)), cudaSuccess; };
  a.event_query = [](cudaEvent_t) { return event_state.load(); };
  a.event_destroy = [](cudaEvent_t e) { return delete reinterpret_cast<char*>(e), cudaSuccess; };
  a.malloc = [](void** p, std::size_t n) { return note("cudaMalloc"), *p = std::malloc(n), cudaSuccess; };
  a.free = [](void* p) { return note("cudaFree"), std::free(p), cudaSuccess; };
  a.memcpy_async = [](void* d, const void* s, std::size_t n, cudaMemcpyKind, cudaStream_t) { return std::memcpy(d, s, n), cudaSuccess; };
  a.get_unique_id = [](ncclUniqueId* id) {
    std::memset(id->internal, 0, sizeof id->internal);
    std::lock_guard lock(mutex);
    std::snprintf(id->internal, sizeof id->internal, "fake-id-%d", ++next_id);
    return ncclSuccess;
  };
  a.comm_init_rank_config = [](ncclComm_t* c, int n, ncclUniqueId id, int rank, ncclConfig_t* config) {
    note("ncclCommInitRankConfig nranks=" + std::to_string(n) + " rank=" + std::to_string(rank) + " id=" + id.internal +
         " blocking=" + std::to_string(config->blocking));
    *c = reinterpret_cast<ncclComm_t>(new char);
    std::lock_guard lock(mutex);
    comm_ids[*c] = id.internal;
    return ncclInProgress;  // non-blocking: the backend polls
  };
  a.comm_get_async_error = [](ncclComm_t, ncclResult_t* r) { return *r = async_state.load(), ncclSuccess; };
  a.comm_finalize = [](ncclComm_t) { return note("ncclCommFinalize"), ncclSuccess; };
  a.comm_destroy = [](ncclComm_t c) { return note("ncclCommDestroy"), delete reinterpret_cast<char*>(c), ncclSuccess; };
  a.comm_abort = [](ncclComm_t c) { return note("ncclCommAbort"), delete reinterpret_cast<char*>(c), ncclSuccess; };
  a.result_string = [](ncclResult_t) { return "fake nccl failure"; };
  a.last_error = [](ncclComm_t) { return "peer 1 vanished"; };
  a.all_gather = [](const void* s, void* r, std::size_t n, ncclDataType_t t, ncclComm_t, cudaStream_t st) {
    note("ncclAllGather count=" + std::to_string(n) + " type=" + std::to_string(t) + " stream=" + ptr(st));
    std::memmove(r, s, n * type_bytes(t));
    return collective_result;
  };
  a.all_reduce = [](const void* s, void* r, std::size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t, cudaStream_t st) {
    note("ncclAllReduce count=" + std::to_string(n) + " type=" + std::to_string(t) + " op=" + std::to_string(op) + " stream=" + ptr(st));
    std::memmove(r, s, n * type_bytes(t));
    return collective_result;
  };
  a.broadcast = [](const void* s, void* r, std::size_t n, ncclDataType_t t, int root, ncclComm_t, cudaStream_t) {
    note("ncclBroadcast count=" + std::to_string(n) + " type=" + std::to_string(t) + " root=" + std::to_string(root));
    std::memmove(r, s, n * type_bytes(t));
    return collective_result;
  };
  a.reduce_scatter = [](const void* s, void* r, std::size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t, cudaStream_t) {
    note("ncclReduceScatter count=" + std::to_string(n) + " type=" + std::to_string(t) + " op=" + std::to_string(op));
    std::memmove(r, s, n * type_bytes(t));
    return collective_result;
  };
  // Point-to-point between the two ends of a communicator (its unique id), in order: a send fills
  // the oldest receive waiting for data, or waits for the next receive.
  a.send = [](const void* data, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    note("ncclSend count=" + std::to_string(n) + " type=" + std::to_string(t) + " peer=" + std::to_string(peer) + " stream=" + ptr(st));
    std::lock_guard lock(mutex);
    Mailbox& box = mailboxes[comm_ids.at(c)];
    const auto* bytes = static_cast<const std::byte*>(data);
    if (box.receivers.empty()) {
      box.messages.emplace_back(bytes, bytes + n * type_bytes(t));
    } else {
      std::memcpy(box.receivers.front(), bytes, n * type_bytes(t));
      box.receivers.pop_front();
    }
    return collective_result;
  };
  a.recv = [](void* data, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    note("ncclRecv count=" + std::to_string(n) + " type=" + std::to_string(t) + " peer=" + std::to_string(peer) + " stream=" + ptr(st));
    std::lock_guard lock(mutex);
    Mailbox& box = mailboxes[comm_ids.at(c)];
    if (box.messages.empty()) {
      box.receivers.push_back(data);
    } else {
      std::memcpy(data, box.messages.front().data(), box.messages.front().size());
      box.messages.pop_front();
    }
    return collective_result;
  };
  return a;
}

accel::NcclCommOptions options(const std::string& name = "default") {
  accel::NcclCommOptions o;
  o.name = name;
  o.api = std::make_shared<const accel::NcclApi>(api());
  return o;
}

bool logged(const std::vector<std::string>& log, const std::string& call) {
  return std::find(log.begin(), log.end(), call) != log.end();
}

}  // namespace fake

TEST_CASE("simulated nccl: buffer collectives map element type, operator, count and root onto NCCL's", "[nccl]") {
  fake::take();
  accel::NcclCommunicator comm(nullptr, 0, 1, 1, std::chrono::seconds(5), fake::options());
  REQUIRE(comm.device_buffers());
  REQUIRE(fake::logged(fake::take(), "ncclCommInitRankConfig nranks=1 rank=0 id=fake-id-" + std::to_string(fake::next_id) + " blocking=0"));

  std::vector<accel::half> h(5, accel::half(1.5f));
  accel::all_reduce(comm, std::span(h), accel::ReduceOp::avg);
  std::vector<accel::bfloat16> b(3);
  accel::all_reduce(comm, std::span(b), accel::ReduceOp::max);
  std::vector<std::int64_t> l(4, 9);
  accel::broadcast(comm, std::span(l), 0);
  std::vector<std::uint8_t> send(6, 2), recv(6);
  accel::all_gather(comm, std::span<const std::uint8_t>(send), std::span(recv));
  std::vector<double> d(8, 1.0), part(8);
  accel::reduce_scatter(comm, std::span<const double>(d), std::span(part), accel::ReduceOp::prod);
  std::vector<std::int32_t> i(2);
  accel::all_reduce_async(comm, std::span(i), accel::ReduceOp::min).wait();
  std::vector<std::uint32_t> u(2);
  accel::all_reduce(comm, std::span(u), accel::ReduceOp::sum);
  std::vector<float> f(7);
  int marker = 0;
  const auto user_stream = reinterpret_cast<cudaStream_t>(&marker);
  accel::all_reduce(comm, std::span(f), accel::ReduceOp::sum, user_stream);
  std::vector<std::int8_t> c(1);
  std::vector<std::uint64_t> ul(1);
  accel::all_reduce(comm, std::span(c), accel::ReduceOp::sum);
  accel::all_reduce(comm, std::span(ul), accel::ReduceOp::sum);

  const auto log = fake::take();
  auto has = [&](const std::string& prefix) {
    return std::any_of(log.begin(), log.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
  };
  CHECK(has("ncclAllReduce count=5 type=" + std::to_string(ncclFloat16) + " op=" + std::to_string(ncclAvg)));
  CHECK(has("ncclAllReduce count=3 type=" + std::to_string(ncclBfloat16) + " op=" + std::to_string(ncclMax)));
  CHECK(has("ncclBroadcast count=4 type=" + std::to_string(ncclInt64) + " root=0"));
  CHECK(has("ncclAllGather count=6 type=" + std::to_string(ncclUint8)));
  CHECK(has("ncclReduceScatter count=8 type=" + std::to_string(ncclFloat64) + " op=" + std::to_string(ncclProd)));
  CHECK(has("ncclAllReduce count=2 type=" + std::to_string(ncclInt32) + " op=" + std::to_string(ncclMin)));
  CHECK(has("ncclAllReduce count=2 type=" + std::to_string(ncclUint32) + " op=" + std::to_string(ncclSum)));
  CHECK(has("ncclAllReduce count=1 type=" + std::to_string(ncclInt8)));
  CHECK(has("ncclAllReduce count=1 type=" + std::to_string(ncclUint64)));
  // The stream overload enqueues on the caller's stream and records the completion event there.
  CHECK(has("ncclAllReduce count=7 type=" + std::to_string(ncclFloat32) + " op=" + std::to_string(ncclSum) +
            " stream=" + fake::ptr(user_stream)));
  CHECK(has("cudaEventRecord stream=" + fake::ptr(user_stream)));
  CHECK(l == std::vector<std::int64_t>(4, 9));
  CHECK(recv == send);
}

TEST_CASE("simulated nccl: gather_object through the padded all-gather, the caller's device restored", "[nccl]") {
  fake::current_device = 7;
  fake::take();
  {
    accel::NcclCommunicator comm(nullptr, 0, 1, 2, std::chrono::seconds(5), fake::options());
    REQUIRE(fake::current_device == 7);
    REQUIRE(accel::gather_object(comm, std::string("hello")) == std::vector<std::string>{"hello"});
    const std::string big(100'000, 'y');
    REQUIRE(accel::gather_object(comm, big) == std::vector<std::string>{big});
    REQUIRE(fake::current_device == 7);
    std::vector<float> f(3);
    accel::all_reduce(comm, std::span(f), accel::ReduceOp::sum);
    REQUIRE(fake::current_device == 7);
  }
  const auto log = fake::take();
  REQUIRE(fake::logged(log, "cudaSetDevice 2"));
  REQUIRE(fake::logged(log, "cudaSetDevice 7"));
  REQUIRE(log.back() != "cudaSetDevice 2");
}

TEST_CASE("simulated nccl: a failing collective aborts the communicator at once, before its buffers are freed", "[nccl]") {
  fake::take();
  {
    accel::NcclCommunicator comm(nullptr, 0, 1, 0, std::chrono::seconds(5), fake::options());
    const std::string big(100'000, 'x');  // past the inline limit: allocates the device buffers
    REQUIRE(accel::gather_object(comm, big) == std::vector<std::string>{big});
    REQUIRE(fake::logged(fake::take(), "cudaMalloc"));
    fake::collective_result = ncclSystemError;
    std::vector<float> f(3);
    REQUIRE_THROWS_WITH(accel::all_reduce(comm, std::span(f), accel::ReduceOp::sum),
                        accel_test::contains("ncclAllReduce failed on rank 0: fake nccl failure (peer 1 vanished); the NCCL "
                                             "communicator was aborted"));
    fake::collective_result = ncclSuccess;
    const auto at_failure = fake::take();
    REQUIRE(fake::logged(at_failure, "ncclCommAbort"));  // now, not at destruction
    REQUIRE_FALSE(fake::logged(at_failure, "cudaFree"));
    REQUIRE_THROWS_WITH(accel::gather_object(comm, 1), accel_test::contains("aborted after an earlier failure"));
  }
  const auto after = fake::take();
  REQUIRE(fake::logged(after, "cudaFree"));
  REQUIRE_FALSE(fake::logged(after, "ncclCommAbort"));     // once is enough
  REQUIRE_FALSE(fake::logged(after, "ncclCommFinalize"));  // an aborted communicator is not finalized
}

TEST_CASE("simulated nccl: a re-created communicator never picks up an earlier instance's unique id", "[nccl]") {
  accel_test::LocalStore job;
  // One connection per rank for the whole test: a rank whose connection closed counts as exited.
  std::shared_ptr<accel::StoreClient> clients[2] = {job.client(0, 2, std::chrono::seconds(10)), job.client(1, 2, std::chrono::seconds(10))};
  auto client = [&](int rank) { return clients[rank]; };
  fake::take();
  for (int instance = 0; instance < 2; ++instance) {
    // Rank 0 (which creates the id) arrives late in the second instance: rank 1 must wait for the
    // new id instead of reading the first instance's.
    auto r0 = std::async(std::launch::async, [&] {
      if (instance == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      accel::NcclCommunicator comm(client(0), 0, 2, 0, std::chrono::seconds(10), fake::options("again"));
    });
    accel::NcclCommunicator comm(client(1), 1, 2, 1, std::chrono::seconds(10), fake::options("again"));
    r0.get();
  }
  std::vector<std::string> ids;
  for (const auto& s : fake::take())
    if (s.rfind("ncclCommInitRankConfig", 0) == 0) ids.push_back(s.substr(s.find(" id=") + 4));
  REQUIRE(ids.size() == 4);
  std::sort(ids.begin(), ids.end());
  REQUIRE(ids[0] == ids[1]);
  REQUIRE(ids[2] == ids[3]);
  REQUIRE(ids[1] != ids[2]);
}

TEST_CASE("simulated nccl: work nobody waits for is watched; a peer's failure or the timeout aborts the communicator", "[nccl]") {
  using namespace std::chrono_literals;
  auto aborted_within = [](std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (fake::logged(fake::take(), "ncclCommAbort")) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  };
  std::vector<float> f(4);
  SECTION("an asynchronous NCCL error while work is in flight") {
    fake::take();
    accel::NcclCommunicator comm(nullptr, 0, 1, 0, 60s, fake::options());
    fake::event_state = cudaErrorNotReady;  // the kernel never finishes: its peer is gone
    auto handle = accel::all_reduce_async(comm, std::span(f), accel::ReduceOp::sum);
    std::this_thread::sleep_for(60ms);
    REQUIRE_FALSE(fake::logged(fake::take(), "ncclCommAbort"));  // healthy but slow: left alone
    fake::async_state = ncclRemoteError;
    CHECK(aborted_within(5s));  // nobody called wait(): the watchdog aborted it
    fake::event_state = cudaSuccess, fake::async_state = ncclSuccess;
    REQUIRE_THROWS_WITH(accel::all_reduce(comm, std::span(f), accel::ReduceOp::sum),
                        accel_test::contains("aborted after an earlier failure (all_reduce") &&
                            accel_test::contains("failed on rank 0: fake nccl failure (peer 1 vanished); the watchdog aborted"));
    REQUIRE_THROWS_WITH(handle.wait(), accel_test::contains("aborted after an earlier failure"));
  }
  SECTION("work older than the timeout") {
    fake::take();
    accel::NcclCommunicator comm(nullptr, 0, 1, 0, 200ms, fake::options());
    fake::event_state = cudaErrorNotReady;
    auto handle = accel::all_reduce_async(comm, std::span(f), accel::ReduceOp::sum);
    CHECK(aborted_within(5s));
    fake::event_state = cudaSuccess;
    REQUIRE_THROWS_WITH(accel::all_reduce(comm, std::span(f), accel::ReduceOp::sum),
                        accel_test::contains("did not finish on the GPU within 200 ms on rank 0 and nobody waited for it"));
  }
  SECTION("finished work is forgotten and never aborts anything") {
    fake::take();
    accel::NcclCommunicator comm(nullptr, 0, 1, 0, 200ms, fake::options());
    for (int i = 0; i < 5; ++i) (void)accel::all_reduce_async(comm, std::span(f), accel::ReduceOp::sum);
    std::this_thread::sleep_for(400ms);  // twice the timeout: nothing is in flight any more
    accel::all_reduce(comm, std::span(f), accel::ReduceOp::sum);
    CHECK_FALSE(fake::logged(fake::take(), "ncclCommAbort"));
  }
  fake::event_state = cudaSuccess, fake::async_state = ncclSuccess;
}
#endif

#if ACCEL_HAS_NCCL()
TEST_CASE("simulated nccl: point-to-point checks on the host, then moves spans with ncclSend/ncclRecv, a communicator per direction",
          "[nccl][p2p]") {
  accel_test::LocalStore job;
  std::shared_ptr<accel::StoreClient> clients[2] = {job.client(0, 2, std::chrono::seconds(10)), job.client(1, 2, std::chrono::seconds(10))};
  int marker = 0;
  const auto user_stream = reinterpret_cast<cudaStream_t>(&marker);
  std::vector<float> sent(5, 1.5f), got(5);
  std::vector<std::int64_t> back = {7, 8, 9}, got_back(3);
  std::vector<std::int32_t> both[2] = {std::vector<std::int32_t>(1000, 10), std::vector<std::int32_t>(1000, 11)};
  std::vector<std::int32_t> both_got[2] = {std::vector<std::int32_t>(1000), std::vector<std::int32_t>(1000)};
  std::string mismatch[2], object;
  fake::take();
  auto rank = [&](int r) {
    accel::NcclCommunicator comm(clients[r], r, 2, r, std::chrono::seconds(10), fake::options("p2p"));
    const int peer = 1 - r;
    // 1. Stream-less, 0 -> 1; 2. the caller's stream, 1 -> 0.
    if (r == 0) accel::send(comm, std::span(sent), 1);
    else accel::recv(comm, std::span(got), 0);
    if (r == 1) accel::send(comm, std::span(back), 0, user_stream);
    else accel::recv(comm, std::span(got_back), 1, user_stream);
    // 3. A mismatch fails both ends on the host: nothing is enqueued.
    try {
      std::vector<float> four(4), five(5);
      if (r == 0) accel::send(comm, std::span(four), 1);
      else accel::recv(comm, std::span(five), 0);
    } catch (const accel::usage_error& e) {
      mismatch[r] = e.what();
    }
    // 4. Both directions at once: send_async beside recv.
    auto h = accel::send_async(comm, std::span(both[r]), peer);
    accel::recv(comm, std::span(both_got[r]), peer);
    h.wait();
    // 5. Objects travel through the store, not the GPU.
    if (r == 0) accel::send_object(comm, std::string("through the store"), 1);
    else object = accel::recv_object<std::string>(comm, 0);
  };
  auto r0 = std::async(std::launch::async, rank, 0);
  rank(1);
  r0.get();
  const auto log = fake::take();
  auto count = [&](const std::string& prefix) {
    return std::count_if(log.begin(), log.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
  };
  auto find = [&](const std::string& prefix) {
    const auto it = std::find_if(log.begin(), log.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
    return it == log.end() ? std::string() : *it;
  };
  // Two ranks' main communicators, then one 2-rank communicator per direction on each end.
  CHECK(count("ncclCommInitRankConfig nranks=2 rank=0 id=fake-id-") == 3);
  CHECK(count("ncclCommInitRankConfig nranks=2 rank=1 id=fake-id-") == 3);
  const std::string f32 = std::to_string(ncclFloat32), i64 = std::to_string(ncclInt64), i32 = std::to_string(ncclInt32);
  CHECK(count("ncclSend count=5 type=" + f32 + " peer=1 ") == 1);
  CHECK(count("ncclRecv count=5 type=" + f32 + " peer=0 ") == 1);
  CHECK(count("ncclSend count=3 type=" + i64 + " peer=1 stream=" + fake::ptr(user_stream)) == 1);
  CHECK(count("ncclRecv count=3 type=" + i64 + " peer=0 stream=" + fake::ptr(user_stream)) == 1);
  CHECK(count("ncclSend count=4 ") == 0);  // the mismatched message
  CHECK(count("ncclSend count=1000 type=" + i32) == 2);
  CHECK(count("ncclRecv count=1000 type=" + i32) == 2);
  // Without a stream: the direction's own stream, not the caller's, and the two directions differ.
  const std::string first_send = find("ncclSend count=5 ");
  CHECK(first_send.find("stream=" + fake::ptr(user_stream)) == std::string::npos);
  const std::string streams[2] = {find("ncclSend count=1000 ").substr(find("ncclSend count=1000 ").find("stream=")),
                                  find("ncclRecv count=1000 ").substr(find("ncclRecv count=1000 ").find("stream="))};
  CHECK(streams[0] != streams[1]);
  CHECK(got == sent);
  CHECK(got_back == back);
  CHECK(both_got[0] == both[1]);
  CHECK(both_got[1] == both[0]);
  CHECK(object == "through the store");
  for (int r = 0; r < 2; ++r)
    CHECK(mismatch[r] ==
          "[accel.usage] send/recv mismatch in message #2 from rank 0 to rank 1: rank 0 sends 4 float32 elements (send), rank 1 "
          "expects 5 float32 elements (recv); both ends must pass the same element type and length (send/recv), or the same type "
          "(send_object/recv_object)");
}

TEST_CASE("simulated nccl: destroying a communicator with an unmatched send_async pending does not wait out the timeout", "[nccl][p2p]") {
  accel_test::LocalStore job;
  std::shared_ptr<accel::StoreClient> clients[2] = {job.client(0, 2, std::chrono::seconds(60)), job.client(1, 2, std::chrono::seconds(60))};
  fake::take();
  std::promise<void> done;
  auto rank1 = std::async(std::launch::async, [&] {
    accel::NcclCommunicator comm(clients[1], 1, 2, 1, std::chrono::seconds(60), fake::options("p2p-destroy"));
    done.get_future().wait();  // lives on, never receives
  });
  std::vector<float> v(8);
  accel::CollectiveHandle h;
  const auto start = std::chrono::steady_clock::now();
  {
    accel::NcclCommunicator comm(clients[0], 0, 2, 0, std::chrono::seconds(60), fake::options("p2p-destroy"));
    h = accel::send_async(comm, std::span(v), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // waiting for rank 1's descriptor
  }
  const auto took = std::chrono::steady_clock::now() - start;
  std::string error;
  try {
    h.wait();
  } catch (const accel::comm_error& e) {
    error = e.what();
  }
  done.set_value();
  rank1.get();
  fake::take();
  CHECK(took < std::chrono::seconds(15));
  CHECK(error.find("the communicator is being destroyed") != std::string::npos);
}

TEST_CASE("simulated nccl: a peer that closed its communicator but lives on is named within seconds, not waited for", "[nccl][p2p]") {
  accel_test::LocalStore job;
  std::shared_ptr<accel::StoreClient> clients[2] = {job.client(0, 2, std::chrono::seconds(60)), job.client(1, 2, std::chrono::seconds(60))};
  fake::take();
  std::promise<void> done;
  auto rank1 = std::async(std::launch::async, [&] {
    { accel::NcclCommunicator comm(clients[1], 1, 2, 1, std::chrono::seconds(60), fake::options("p2p-closed")); }  // made, then closed
    done.get_future().wait();  // lives on, keeping its store connection
  });
  std::string error;
  const auto start = std::chrono::steady_clock::now();
  try {
    accel::NcclCommunicator comm(clients[0], 0, 2, 0, std::chrono::seconds(60), fake::options("p2p-closed"));
    std::vector<float> v(8);
    accel::recv(comm, std::span(v), 1);
  } catch (const accel::comm_error& e) {
    error = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - start;
  done.set_value();
  rank1.get();
  fake::take();
  CHECK(took < std::chrono::seconds(15));
  CHECK(error == "[accel.comm] rank 1 closed its communicator without taking part in message #1 from rank 1 to rank 0");
}
#endif
