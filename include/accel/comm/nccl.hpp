// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file nccl.hpp
/// @brief NcclCommunicator: collectives between GPU processes over NCCL (the only header that includes nccl.h).
///
/// Bootstrap: rank 0 draws a generation number and creates the ncclUniqueId; one store exchange
/// hands both to every rank (so a communicator re-created under the same name never picks up an
/// earlier one's id, and its round keys carry the generation). The communicator is created
/// non-blocking and every wait polls ncclCommGetAsyncError against the timeout; any failure aborts
/// it at once (ncclCommAbort, before its buffers are freed). A round first exchanges headers and
/// payload sizes through the store (sequence check, failure markers), then moves the payloads
/// padded to the largest in one ncclAllGather on a dedicated stream. Buffer collectives map onto
/// ncclAllGather / ncclAllReduce / ncclBroadcast / ncclReduceScatter on device memory. Every call
/// that makes the communicator's device current restores the caller's device afterwards. The
/// CUDA and NCCL calls go through a table (NcclApi) that tests replace with a simulation. Work
/// enqueued on a stream that nobody waits for (the *_async calls, or a caller's own stream) is
/// followed by a watchdog thread: an asynchronous NCCL error or work older than the timeout aborts
/// the communicator, so the kernels of a job with a dead peer end instead of spinning forever, and
/// the next call says why. Without
/// NCCL compiled in the class still exists and its constructor throws unavailable_error.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/comm/detail/p2p.hpp>
#include <accel/comm/detail/p2p_store.hpp>
#include <accel/comm/store.hpp>
#include <accel/runtime/text.hpp>

#if ACCEL_HAS_NCCL()
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <accel/runtime/cuda.hpp>
#endif

ACCEL_NAMESPACE_BEGIN

#if ACCEL_HAS_NCCL()
/// @brief The CUDA runtime and NCCL calls NcclCommunicator makes: the real functions by default;
/// tests substitute a simulation to check the argument mapping and the failure paths without a GPU.
struct NcclApi {
  cudaError_t (*get_device_count)(int*) = &cudaGetDeviceCount;
  cudaError_t (*get_device)(int*) = &cudaGetDevice;
  cudaError_t (*set_device)(int) = &cudaSetDevice;
  cudaError_t (*get_last_error)() = &cudaGetLastError;
  const char* (*error_name)(cudaError_t) = &cudaGetErrorName;
  const char* (*error_string)(cudaError_t) = &cudaGetErrorString;
  cudaError_t (*stream_create)(cudaStream_t*, unsigned int) = &cudaStreamCreateWithFlags;
  cudaError_t (*stream_destroy)(cudaStream_t) = &cudaStreamDestroy;
  cudaError_t (*stream_query)(cudaStream_t) = &cudaStreamQuery;
  cudaError_t (*event_create)(cudaEvent_t*, unsigned int) = &cudaEventCreateWithFlags;
  cudaError_t (*event_record)(cudaEvent_t, cudaStream_t) = &cudaEventRecord;
  cudaError_t (*event_query)(cudaEvent_t) = &cudaEventQuery;
  cudaError_t (*event_destroy)(cudaEvent_t) = &cudaEventDestroy;
  cudaError_t (*malloc)(void**, std::size_t) = &cudaMalloc;
  cudaError_t (*free)(void*) = &cudaFree;
  cudaError_t (*memcpy_async)(void*, const void*, std::size_t, cudaMemcpyKind, cudaStream_t) = &cudaMemcpyAsync;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = &ncclGetUniqueId;
  ncclResult_t (*comm_init_rank_config)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = &ncclCommInitRankConfig;
  /// ncclCommSplit where NCCL has it (2.18 on); null: split() creates groups from a unique id instead
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  ncclResult_t (*comm_split)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) = &ncclCommSplit;
#else
  ncclResult_t (*comm_split)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) = nullptr;
#endif
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*) = &ncclCommGetAsyncError;
  ncclResult_t (*comm_finalize)(ncclComm_t) = &ncclCommFinalize;
  ncclResult_t (*comm_destroy)(ncclComm_t) = &ncclCommDestroy;
  ncclResult_t (*comm_abort)(ncclComm_t) = &ncclCommAbort;
  const char* (*result_string)(ncclResult_t) = &ncclGetErrorString;
  const char* (*last_error)(ncclComm_t) = &ncclGetLastError;
  ncclResult_t (*all_gather)(const void*, void*, std::size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = &ncclAllGather;
  ncclResult_t (*all_reduce)(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = &ncclAllReduce;
  ncclResult_t (*broadcast)(const void*, void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = &ncclBroadcast;
  ncclResult_t (*reduce_scatter)(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) =
      &ncclReduceScatter;
  ncclResult_t (*send)(const void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = &ncclSend;
  ncclResult_t (*recv)(void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = &ncclRecv;
};
#endif

/// @brief Settings of an NcclCommunicator.
struct NcclCommOptions {
  std::string name = "default";  ///< distinguishes several communicators of one job (same on every rank)
#if ACCEL_HAS_NCCL()
  std::shared_ptr<const NcclApi> api;  ///< the CUDA/NCCL calls (null: the real ones); tests pass a simulation
#endif
};

namespace detail {

/// @brief Payloads of at most this many bytes ride in the store exchange; a round whose payloads
/// all do never touches the GPU (descriptor rounds, small gathers).
inline constexpr std::size_t nccl_inline_limit = 16 * 1024;

/// @brief How variable-sized payloads are padded for one fixed-size all-gather (pure).
struct PaddedLayout {
  std::size_t chunk = 0;  ///< bytes each rank sends: the largest payload rounded up to `align`
  std::size_t total = 0;  ///< chunk * ranks: the receive buffer
};

/// @brief The padded layout for payload sizes `sizes` (chunk 0 when every payload is empty).
inline PaddedLayout padded_layout(std::span<const std::uint64_t> sizes, std::size_t align = 16) {
  std::uint64_t biggest = 0;
  for (auto s : sizes) biggest = std::max(biggest, s);
  PaddedLayout l;
  l.chunk = static_cast<std::size_t>((biggest + align - 1) / align * align);
  l.total = l.chunk * sizes.size();
  return l;
}

#if ACCEL_HAS_NCCL()
/// @brief NCCL's data type for an element type (pure).
constexpr ncclDataType_t nccl_data_type(ElementType t) noexcept {
  switch (t) {
    case ElementType::int8: return ncclInt8;
    case ElementType::uint8: return ncclUint8;
    case ElementType::int32: return ncclInt32;
    case ElementType::uint32: return ncclUint32;
    case ElementType::int64: return ncclInt64;
    case ElementType::uint64: return ncclUint64;
    case ElementType::float16: return ncclFloat16;
    case ElementType::bfloat16: return ncclBfloat16;
    case ElementType::float32: return ncclFloat32;
    case ElementType::float64: return ncclFloat64;
  }
  return ncclUint8;
}
/// @brief NCCL's reduction for a ReduceOp (pure).
constexpr ncclRedOp_t nccl_reduce_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: return ncclAvg;
  }
  return ncclSum;
}

/// @brief Makes `device` current through the communicator's call table for its lifetime, restoring
/// the caller's device after (runtime/cuda.hpp's ScopedCudaDevice).
class CurrentDevice : public ScopedCudaDevice {
 public:
  CurrentDevice(const NcclApi& api, int device) : ScopedCudaDevice(device, {api.get_device, api.set_device, api.get_last_error}) {}
};
#endif

}  // namespace detail

/// @brief Collectives between GPU processes over NCCL; metadata through the job's store.
class NcclCommunicator final : public Communicator {
 public:
  /// @brief Creates the NCCL communicator. Collective: every rank constructs it with the same name.
  /// @param store the job's store (may be null when size == 1)
  /// @param device this rank's CUDA device (made current during every call, the caller's restored after)
  /// @param timeout bound on init and every collective
  /// @throws unavailable_error when NCCL is not compiled in or no CUDA device is visible
  /// @throws nccl_error / cuda_error when a call fails; timeout_error when init does not finish in time
  NcclCommunicator(std::shared_ptr<StoreClient> store, int rank, int size, int device, std::chrono::milliseconds timeout,
                   NcclCommOptions options = {})
      : Communicator(rank, size, timeout), store_(std::move(store)), options_(std::move(options)), device_(device) {
#if ACCEL_HAS_NCCL()
    if (!options_.api) options_.api = std::make_shared<const NcclApi>();
    const NcclApi& api = *options_.api;
    ACCEL_EXPECTS(size == 1 || store_, "NcclCommunicator: a store is required for ", size, " ranks");
    int count = 0;
    if (api.get_device_count(&count) != cudaSuccess || count == 0) {
      (void)api.get_last_error();
      detail::throw_error<unavailable_error>("NCCL needs a CUDA device but none is visible to this process; use the CPU backend "
                                             "(StateOptions::cpu, ACCEL_USE_CPU=1 or ACCEL_COMM_BACKEND=cpu)");
    }
    detail::CurrentDevice on(api, device_);
    // Rank 0 draws a generation and the id; one exchange (a fresh round that completes only when
    // every rank of this instance arrived) hands both out, so no rank reads an earlier instance's id.
    ncclUniqueId id{};
    std::uint64_t generation = 0;
    if (rank == 0) nccl(api.get_unique_id(&id), "ncclGetUniqueId");
    if (size > 1) {
      const std::string base = "accel/nccl/" + options_.name + "/";
      detail::WireWriter w;
      if (rank == 0)
        w.u64(static_cast<std::uint64_t>(store_->add(base + "generation", 1)))
            .bytes(std::as_bytes(std::span<const char>(id.internal, sizeof id.internal)));
      const Blobs all = store_->exchange(base + "setup", rank, size, w.take(), "NCCL communicator setup (" + options_.name + ")");
      detail::WireReader rd(all[0]);
      generation = rd.u64();
      const auto got = rd.bytes();
      if (got.size() != sizeof id.internal)
        detail::throw_error<comm_error>("the ncclUniqueId from rank 0 has ", got.size(), " bytes, ", sizeof id.internal, " expected");
      std::memcpy(id.internal, got.data(), got.size());
    }
    generation_ = generation;
    prefix_ = "accel/nccl/" + options_.name + "/" + std::to_string(generation) + "/";
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so every wait below can be bounded and the communicator aborted
    try {
      nccl(api.comm_init_rank_config(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
      wait_comm("ncclCommInitRankConfig");
      cuda(api.stream_create(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    } catch (...) {
      release();  // no destructor runs for a constructor that throws
      throw;
    }
#else
    (void)device_;
    detail::throw_error<unavailable_error>("NCCL is not compiled in; build with -DACCEL_WITH_NCCL=ON (needs the CUDA toolkit and "
                                           "NCCL), or use the CPU backend (ACCEL_COMM_BACKEND=cpu)");
#endif
  }

  ~NcclCommunicator() override {
    store_p2p_.abandon();  // a queued send or receive waiting in the store ends now
    stop_p2p();  // one waiting on the GPU sees p2p_closing() (wait_until)
#if ACCEL_HAS_NCCL()
    // Peers waiting in the store for a message with this rank learn that it will not come (closed()).
    if (store_) try {
        store_->set(prefix_ + "closed/" + std::to_string(rank()), std::string_view("1"));
      } catch (...) {  // a dead store: nobody is left to ask
      }
    release();
#endif
  }

  [[nodiscard]] std::string backend() const override { return "nccl"; }
  /// @brief The CUDA device this communicator runs on.
  [[nodiscard]] int device() const noexcept { return device_; }
  /// @brief Buffer collectives take device memory of device().
  [[nodiscard]] bool device_buffers() const noexcept override { return true; }

 protected:
  /// Point-to-point: the two descriptors are checked through the store first, on the host
  /// (detail/p2p_store.hpp, which also carries objects: they live in host memory); a span's data
  /// (device memory of this rank's GPU) then moves with ncclSend / ncclRecv, enqueued on the
  /// caller's stream when it passed one (not waited for), else on this communicator's own stream
  /// for that direction, waited for (as the buffer collectives without a stream).
  ///
  /// Each direction between two ranks has a 2-rank NCCL communicator and a stream of its own,
  /// made by the two ranks on their first message that way (the sender draws the unique id and
  /// hands it over in the store). Why not this communicator and one stream: NCCL runs the kernels
  /// of one communicator one after another, so with a send_async beside a recv between the same
  /// two ranks, each rank's send kernel could sit in front of its receive kernel while waiting for
  /// the peer's receive kernel, which sits behind the peer's own send: both hang once a message
  /// outgrows NCCL's buffers. Separate streams alone do not help (the kernels are still one
  /// communicator's), and grouping (ncclGroupStart/End) only helps when both calls are ready at
  /// the same moment on one thread, which two independent calls are not. With a communicator per
  /// direction, each one's kernels come in message order on both ranks, so neither waits behind
  /// the other direction. Work enqueued here is followed by the watchdog like the collectives'.
  CollectiveHandle p2p_send(const P2pSend& m) override {
#if ACCEL_HAS_NCCL()
    const auto mine = detail::decode_p2p_descriptor(m.descriptor, rank_name(rank()));
    const bool device = mine.kind == detail::P2pKind::buffer;
    if (!store_p2p().send(m.peer, m.number, m.label, m.descriptor, m.data.head, m.data.body, m.accepts, !device) || !device) return {};
    if (mine.count == 0) return {};
    return transfer(true, m.peer, m.data.head.data(), nullptr, mine, m.label, m.stream);
#else
    (void)m;
    detail::throw_error<unavailable_error>("NCCL is not compiled in");
#endif
  }
  CollectiveHandle p2p_recv(const P2pRecv& m) override {
#if ACCEL_HAS_NCCL()
    const auto mine = detail::decode_p2p_descriptor(m.descriptor, rank_name(rank()));
    const bool device = mine.kind == detail::P2pKind::buffer;
    std::byte* out = store_p2p().recv(m.peer, m.number, m.label, m.descriptor, m.place, !device);
    if (!out || !device || mine.count == 0) return {};
    return transfer(false, m.peer, nullptr, out, mine, m.label, m.stream);
#else
    (void)m;
    detail::throw_error<unavailable_error>("NCCL is not compiled in");
#endif
  }

  /// The group's NCCL communicator: ncclCommSplit (every rank of this one takes part, no_group
  /// ranks with NCCL_SPLIT_NOCOLOR), or where NCCL lacks it, ncclCommInitRank with a unique id
  /// that the group's rank 0 hands out in one round of this communicator. Its store keys are named
  /// after this instance, the split and the color.
  std::shared_ptr<Communicator> make_group(const GroupSpec& spec) override {
#if ACCEL_HAS_NCCL()
    const NcclApi& api = *options_.api;
    const bool member = spec.color != no_group;
    const int group_size = static_cast<int>(spec.members.size());
    NcclCommOptions o = options_;
    o.name = detail::concat(options_.name, "/", generation_, "/split", spec.split_seq, "/", spec.color);
    ncclComm_t child = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (api.comm_split) {
      std::unique_lock lock(mutex_);
      throw_if_aborted("split");
      detail::CurrentDevice on(api, device_);
      nccl(api.comm_split(comm_, member ? spec.color : NCCL_SPLIT_NOCOLOR, spec.rank, &child, &config), "ncclCommSplit");
      if (!member) wait_comm("ncclCommSplit");  // the group's own members wait on their new communicator
    } else {
      ncclUniqueId id{};
      std::exception_ptr failure;
      if (spec.rank == 0) {
        try {
          detail::CurrentDevice on(api, device_);
          nccl(api.get_unique_id(&id), "ncclGetUniqueId");
        } catch (...) {
          failure = std::current_exception();
        }
      }
      const auto mine = std::as_bytes(std::span<const char>(id.internal, spec.rank == 0 ? sizeof id.internal : 0));
      const Blobs all = all_gather("split.nccl_id", mine, failure);
      if (!member) return nullptr;
      const auto got = all[static_cast<std::size_t>(spec.members.front())];
      if (got.size() != sizeof id.internal)
        detail::throw_error<comm_error>("the ncclUniqueId from ", rank_name(spec.members.front()), " has ", got.size(), " bytes, ",
                                        sizeof id.internal, " expected");
      std::memcpy(id.internal, got.data(), got.size());
      detail::CurrentDevice on(api, device_);
      const ncclResult_t rc = api.comm_init_rank_config(&child, group_size, id, spec.rank, &config);
      if (rc != ncclSuccess && rc != ncclInProgress) {
        if (child) (void)api.comm_abort(child);
        throw nccl_error(static_cast<int>(rc), detail::concat("ncclCommInitRankConfig failed for group rank ", spec.rank, " of ",
                                                              group_size, ": ", api.result_string(rc)));
      }
    }
    if (!member) return nullptr;
    return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(store_, spec.rank, group_size, device_, timeout(), std::move(o),
                                                                  spec.job_ranks, child));
#else
    (void)spec;
    detail::throw_error<unavailable_error>("NCCL is not compiled in");
#endif
  }

  Round exchange(std::uint64_t seq, const std::string& label, std::span<const std::byte> header, const Payload& payload) override {
#if ACCEL_HAS_NCCL()
    {
      std::lock_guard lock(mutex_);
      throw_if_aborted(label);
    }
    const NcclApi& api = *options_.api;
    // 1. Headers and sizes through the store: every rank learns the same facts, so all skip the
    //    data step together when a rank failed or the ranks are out of step.
    //    Small payloads ride along (so descriptor rounds and small gathers never touch the GPU).
    Round r;
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size()));
    const bool small = payload.size() <= detail::nccl_inline_limit;
    Blobs all;
    std::vector<std::span<const std::byte>> inline_parts(static_cast<std::size_t>(size()));
    if (size() == 1) {
      r.headers.push_back(header);
      sizes[0] = payload.size();
      if (small) {
        r.payloads.push_back(payload.head);
        r.payloads.append_to_last(payload.body);
        return r;
      }
    } else {
      detail::WireWriter w;
      w.bytes(header).u64(payload.size());
      if (small) w.bytes(payload.size() == payload.head.size() ? payload.head : std::span<const std::byte>(payload.joined()));
      all = store_->exchange(prefix_ + std::to_string(seq), rank(), size(), w.take(), label, std::nullopt, members_);
      for (std::size_t i = 0; i < all.size(); ++i) {
        detail::WireReader rd(all[i]);
        r.headers.push_back(rd.bytes());
        sizes[i] = rd.u64();
        if (sizes[i] <= detail::nccl_inline_limit) inline_parts[i] = rd.bytes();
      }
    }
    bool in_step = true;
    for (std::size_t i = 0; i < r.headers.size(); ++i) {
      const auto h = detail::decode_round_header(r.headers[i], static_cast<int>(i));
      in_step = in_step && !h.failed && h.seq == seq;
    }
    const auto layout = detail::padded_layout(sizes);
    if (!in_step || layout.chunk == 0) {
      for (std::size_t i = 0; i < sizes.size(); ++i) r.payloads.offset.push_back(0), r.payloads.length.push_back(0);
      return r;
    }
    if (*std::max_element(sizes.begin(), sizes.end()) <= detail::nccl_inline_limit) {
      for (const auto& part : inline_parts) r.payloads.push_back(part);
      return r;
    }
    // 2. One padded all-gather on our own stream, then one copy back to the host.
    std::unique_lock lock(mutex_);
    throw_if_aborted(label);
    detail::CurrentDevice on(api, device_);
    reserve(layout);
    auto* send = static_cast<std::byte*>(send_);
    if (!payload.head.empty())
      cuda(api.memcpy_async(send, payload.head.data(), payload.head.size(), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    if (!payload.body.empty())
      cuda(api.memcpy_async(send + payload.head.size(), payload.body.data(), payload.body.size(), cudaMemcpyHostToDevice, stream_),
           "cudaMemcpyAsync");
    enqueued(api.all_gather(send_, recv_, layout.chunk, ncclUint8, comm_, stream_), "ncclAllGather");
    r.payloads.buffer.resize(layout.total);
    cuda(api.memcpy_async(r.payloads.buffer.data(), recv_, layout.total, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    wait_until([&] { return api.stream_query(stream_); }, label, lock);
    for (std::size_t i = 0; i < sizes.size(); ++i)
      r.payloads.offset.push_back(i * layout.chunk), r.payloads.length.push_back(static_cast<std::size_t>(sizes[i]));
    return r;
#else
    (void)seq, (void)label, (void)header, (void)payload;
    detail::throw_error<unavailable_error>("NCCL is not compiled in");
#endif
  }

  /// @brief The buffer collectives: one NCCL call on the call's stream (or ours), an event after it.
  CollectiveHandle buffer_data(const BufferCall& c, const std::string& label) override {
#if ACCEL_HAS_NCCL()
    std::unique_lock lock(mutex_);
    throw_if_aborted(label);
    const NcclApi& api = *options_.api;
    detail::CurrentDevice on(api, device_);
    cudaStream_t s = c.stream ? static_cast<cudaStream_t>(c.stream) : stream_;
    const ncclDataType_t type = detail::nccl_data_type(c.type);
    const ncclRedOp_t op = detail::nccl_reduce_op(c.op);
    switch (c.kind) {
      case BufferOp::all_gather: enqueued(api.all_gather(c.send, c.recv, c.send_count, type, comm_, s), "ncclAllGather"); break;
      case BufferOp::all_reduce: enqueued(api.all_reduce(c.send, c.recv, c.recv_count, type, op, comm_, s), "ncclAllReduce"); break;
      case BufferOp::broadcast: enqueued(api.broadcast(c.send, c.recv, c.recv_count, type, c.root, comm_, s), "ncclBroadcast"); break;
      case BufferOp::reduce_scatter:
        enqueued(api.reduce_scatter(c.send, c.recv, c.recv_count, type, op, comm_, s), "ncclReduceScatter");
        break;
    }
    cudaEvent_t raw = nullptr;
    cuda(api.event_create(&raw, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const std::shared_ptr<CUevent_st> event(raw, [api = options_.api](cudaEvent_t e) { (void)api->event_destroy(e); });
    cuda(api.event_record(raw, s), "cudaEventRecord");
    in_flight_.push_back({event, label, std::chrono::steady_clock::now(), comm_});
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
    return CollectiveHandle([this, event, label] {
      const NcclApi& a = *options_.api;
      std::unique_lock wait_lock(mutex_);
      wait_until([&] { return a.event_query(event.get()); }, label, wait_lock);
    });
#else
    (void)c, (void)label;
    detail::throw_error<unavailable_error>("NCCL is not compiled in");
#endif
  }

 private:
#if ACCEL_HAS_NCCL()
  // A group's communicator around `comm`, just created by make_group (maybe still initialising).
  NcclCommunicator(std::shared_ptr<StoreClient> store, int rank, int size, int device, std::chrono::milliseconds timeout,
                   NcclCommOptions options, std::vector<int> members, ncclComm_t comm)
      : Communicator(rank, size, timeout), store_(std::move(store)), options_(std::move(options)), device_(device),
        members_(std::move(members)) {
    const NcclApi& api = *options_.api;
    comm_ = comm;
    prefix_ = "accel/nccl/" + options_.name + "/";
    try {
      ACCEL_EXPECTS(size == 1 || store_, "NcclCommunicator: a store is required for ", size, " ranks");
      detail::CurrentDevice on(api, device_);
      wait_comm("the group's NCCL communicator");
      cuda(api.stream_create(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    } catch (...) {
      release();
      throw;
    }
  }

  void cuda(cudaError_t rc, const char* call) {
    if (rc == cudaSuccess) return;
    const NcclApi& api = *options_.api;
    (void)api.get_last_error();
    throw cuda_error(static_cast<int>(rc), detail::concat(call, " failed on device ", device_, ": ", api.error_name(rc), ": ",
                                                          api.error_string(rc)));
  }
  void nccl(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    const NcclApi& api = *options_.api;
    const char* last = comm_ ? api.last_error(comm_) : nullptr;
    const std::string detail_text = last && *last ? detail::concat(" (", last, ")") : std::string();
    abort();
    throw nccl_error(static_cast<int>(rc), detail::concat(call, " failed on rank ", rank(), ": ", api.result_string(rc), detail_text,
                                                          "; the NCCL communicator was aborted"));
  }
  // A call on a non-blocking communicator may still be in progress: wait until it is enqueued.
  void enqueued(ncclResult_t rc, const char* call) {
    nccl(rc, call);
    if (rc == ncclInProgress) wait_comm(call);
  }
  // The error for a call on an aborted communicator, with what aborted it.
  void throw_if_aborted(const std::string& what) const {
    if (!aborted_) return;
    detail::throw_error<comm_error>(what, ": the NCCL communicator was aborted after an earlier failure",
                                    failure_.empty() ? std::string() : " (" + failure_ + ")", "; create a new one");
  }
  // The watchdog thread: follows work enqueued on streams until it finishes (see check_in_flight).
  void watch() {
    std::unique_lock lock(mutex_);
    while (!watchdog_stop_ && !aborted_) {
      watchdog_wake_.wait_for(lock, watchdog_period);
      if (!watchdog_stop_ && !aborted_) check_in_flight(std::chrono::steady_clock::now());
    }
  }
  // Under mutex_: forgets finished work; aborts the communicator (saying why in failure_) when NCCL
  // reports an asynchronous error (a peer died) while work is in flight, or when the oldest work
  // has been running longer than the timeout with nobody waiting for it.
  void check_in_flight(std::chrono::steady_clock::time_point now) {
    const NcclApi& api = *options_.api;
    std::string failed;
    std::erase_if(in_flight_, [&](const InFlight& w) {
      const cudaError_t q = api.event_query(w.event.get());
      if (q != cudaSuccess && q != cudaErrorNotReady && failed.empty())
        failed = detail::concat(w.label, " failed on the GPU on rank ", rank(), ": ", api.error_name(q), ": ", api.error_string(q));
      return q != cudaErrorNotReady;
    });
    if (failed.empty() && in_flight_.empty()) return;
    for (const InFlight& w : in_flight_) {  // the communicator each piece of work runs on (ours, or a point-to-point one)
      if (!failed.empty()) break;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = api.comm_get_async_error(w.comm, &state);
      const ncclResult_t bad = rc != ncclSuccess ? rc : state;
      if (bad != ncclSuccess && bad != ncclInProgress) {
        const char* last = api.last_error(w.comm);
        failed = detail::concat(w.label, " failed on rank ", rank(), ": ", api.result_string(bad),
                                last && *last ? detail::concat(" (", last, ")") : std::string());
      }
    }
    if (failed.empty() && now - in_flight_.front().since > timeout())
      failed = detail::concat(in_flight_.front().label, " did not finish on the GPU within ",
                              text::format_ms(static_cast<std::uint64_t>(timeout().count())), " on rank ", rank(),
                              " and nobody waited for it (is another rank stuck or dead?)");
    if (failed.empty()) return;
    failure_ = failed + "; the watchdog aborted the NCCL communicator";
    (void)api.get_last_error();
    abort();
  }
  void stop_watchdog() noexcept {
    {
      std::lock_guard lock(mutex_);
      watchdog_stop_ = true;
    }
    watchdog_wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }
  // Aborts the communicator now (in-flight NCCL work is cancelled, peers' waits end), so its
  // buffers can be freed safely afterwards; every later call throws.
  void abort() noexcept {
    aborted_ = true;
    in_flight_.clear();
    if (comm_) (void)options_.api->comm_abort(comm_), comm_ = nullptr;
    for (auto& [key, pc] : pair_comms_)
      if (pc.comm) (void)options_.api->comm_abort(pc.comm), pc.comm = nullptr;
  }
  void release() noexcept {
    stop_watchdog();
    const NcclApi& api = *options_.api;
    // Non-blocking finalize: bounded wait for pending work to flush, then destroy; abort otherwise.
    const auto finished = [&](ncclComm_t c) {
      const ncclResult_t fin = api.comm_finalize(c);
      ncclResult_t state = fin;
      if (fin == ncclSuccess || fin == ncclInProgress) {
        state = ncclInProgress;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (api.comm_get_async_error(c, &state) == ncclSuccess && state == ncclInProgress && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      return state == ncclSuccess;
    };
    bool all_finished = true;
    for (auto& [key, pc] : pair_comms_)
      if (pc.comm) all_finished = all_finished && finished(pc.comm);
    if (comm_) all_finished = finished(comm_) && all_finished;
    if (all_finished) {
      for (auto& [key, pc] : pair_comms_)
        if (pc.comm) (void)api.comm_destroy(pc.comm), pc.comm = nullptr;
      if (comm_) (void)api.comm_destroy(comm_), comm_ = nullptr;
    } else {
      abort();
    }
    // Only now, with no NCCL work left that could touch them:
    for (auto& [key, pc] : pair_comms_)
      if (pc.stream) (void)api.stream_destroy(pc.stream), pc.stream = nullptr;
    if (stream_) (void)api.stream_destroy(stream_), stream_ = nullptr;
    if (send_) (void)api.free(send_), send_ = nullptr;
    if (recv_) (void)api.free(recv_), recv_ = nullptr;
  }
  // Polls a communicator's asynchronous state (ours by default) until it leaves ncclInProgress,
  // within the timeout.
  void wait_comm(const char* what, ncclComm_t c = nullptr) {
    const NcclApi& api = *options_.api;
    if (!c) c = comm_;
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto pause = std::chrono::microseconds(10);; pause = std::min(pause * 2, std::chrono::microseconds(2000))) {
      ncclResult_t state = ncclInProgress;
      nccl(api.comm_get_async_error(c, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) nccl(state, what);
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        detail::throw_error<timeout_error>(what, " did not finish within ", text::format_ms(static_cast<std::uint64_t>(timeout().count())),
                                           " on rank ", rank(), "; the NCCL communicator was aborted");
      }
      std::this_thread::sleep_for(pause);
    }
  }
  // The store path of point-to-point messages (descriptors, objects), made on first use.
  detail::StoreP2p& store_p2p() {
    ACCEL_EXPECTS(store_, "NcclCommunicator: point-to-point needs the job's store");
    return store_p2p_.get(*this, store_, prefix_, std::size_t{16} << 20, [this](int r) { return closed(r); });
  }
  // Whether `peer`'s communicator has ended (its destructor sets the key); false when unsure.
  // Asked by the store path's watcher on a connection of its own (a collective may hold the main one).
  bool closed(int peer) {
    try {
      std::shared_ptr<StoreClient> watch;
      {
        std::lock_guard lock(watch_mutex_);
        if (!watch_store_) watch_store_ = store_->connect_again();
        watch = watch_store_;
      }
      watch->wait({prefix_ + "closed/" + std::to_string(peer)}, std::chrono::milliseconds(1));
      return true;
    } catch (const comm_error&) {  // not set (timeout_error), or the store cannot say now
      return false;
    }
  }
  // The 2-rank communicator and stream of messages from `from` to `to` (see p2p_send).
  struct PairComm {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };

  // The pair communicator of this rank's messages to (sending) or from `peer`, made with the peer
  // on the first message that way: the sender (its rank 0) draws the unique id, one store exchange
  // between the two hands it over. Only one call per direction and peer runs at a time (the
  // Communicator's per-peer queues), so no two threads make the same one.
  PairComm pair_comm(bool sending, int peer, const std::string& label) {
    const int from = sending ? rank() : peer, to = sending ? peer : rank();
    {
      std::lock_guard lock(mutex_);
      throw_if_aborted(label);
      if (const auto it = pair_comms_.find({from, to}); it != pair_comms_.end()) return it->second;
    }
    const NcclApi& api = *options_.api;
    ncclUniqueId id{};
    if (sending) {
      std::lock_guard lock(mutex_);
      nccl(api.get_unique_id(&id), "ncclGetUniqueId");
    }
    ACCEL_EXPECTS(store_, "NcclCommunicator: point-to-point needs the job's store");
    const std::string what = detail::concat("the NCCL communicator of messages from ", rank_name(from), " to ", rank_name(to), " (", label, ")");
    // Through the store path's connection of this direction: the destructor's abandon() ends it.
    const Blobs both = store_p2p().handshake(peer, sending, detail::concat("p2p-comm/", from, ">", to),
                                             std::as_bytes(std::span<const char>(id.internal, sizeof id.internal)), what);
    if (both[0].size() != sizeof id.internal)
      detail::throw_error<comm_error>("the ncclUniqueId for ", what, " has ", both[0].size(), " bytes, ", sizeof id.internal, " expected");
    std::memcpy(id.internal, both[0].data(), sizeof id.internal);
    ncclComm_t c = nullptr;
    {
      std::lock_guard lock(mutex_);
      throw_if_aborted(label);
      detail::CurrentDevice on(api, device_);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      nccl(api.comm_init_rank_config(&c, 2, id, sending ? 0 : 1, &config), "ncclCommInitRankConfig");
    }
    // Its initialisation is waited for without holding mutex_: the peer may be making the other
    // direction's communicator first, and this process must be free to take part in that.
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto pause = std::chrono::microseconds(10);; pause = std::min(pause * 2, std::chrono::microseconds(2000))) {
      {
        std::lock_guard lock(mutex_);
        ncclResult_t state = ncclInProgress;
        const ncclResult_t rc = api.comm_get_async_error(c, &state);
        const ncclResult_t bad = rc != ncclSuccess ? rc : state;
        const bool late = std::chrono::steady_clock::now() > deadline;
        if (aborted_ || late || (bad != ncclSuccess && bad != ncclInProgress)) {
          (void)api.comm_abort(c);
          throw_if_aborted(label);
          if (!late) nccl(bad, "ncclCommInitRankConfig");
          abort();
          detail::throw_error<timeout_error>(what, " was not made within ", text::format_ms(static_cast<std::uint64_t>(timeout().count())),
                                             " on rank ", rank(), "; the NCCL communicator was aborted");
        }
        if (bad == ncclSuccess) {
          detail::CurrentDevice on(api, device_);
          PairComm pc{c, nullptr};
          try {
            cuda(api.stream_create(&pc.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
          } catch (...) {
            (void)api.comm_abort(c);
            throw;
          }
          return pair_comms_[{from, to}] = pc;
        }
      }
      std::this_thread::sleep_for(pause);
    }
  }

  // One ncclSend of `in` (sending) or ncclRecv into `out` of a matched message on the caller's
  // stream or the direction's own, an event after it (followed by the watchdog); the handle waits
  // for the event.
  CollectiveHandle transfer(bool sending, int peer, const void* in, void* out, const detail::P2pDescriptor& d, const std::string& label,
                            void* user_stream) {
    const PairComm pc = pair_comm(sending, peer, label);
    std::unique_lock lock(mutex_);
    throw_if_aborted(label);
    const NcclApi& api = *options_.api;
    detail::CurrentDevice on(api, device_);
    const cudaStream_t s = user_stream ? static_cast<cudaStream_t>(user_stream) : pc.stream;
    const auto count = static_cast<std::size_t>(d.count);
    // In the pair's communicator the sender is rank 0 and the receiver rank 1.
    if (sending) enqueued(api.send(in, count, detail::nccl_data_type(d.type), 1, pc.comm, s), "ncclSend");
    else enqueued(api.recv(out, count, detail::nccl_data_type(d.type), 0, pc.comm, s), "ncclRecv");
    cudaEvent_t raw = nullptr;
    cuda(api.event_create(&raw, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const std::shared_ptr<CUevent_st> event(raw, [api = options_.api](cudaEvent_t e) { (void)api->event_destroy(e); });
    cuda(api.event_record(raw, s), "cudaEventRecord");
    in_flight_.push_back({event, label, std::chrono::steady_clock::now(), pc.comm});
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
    return CollectiveHandle([this, event, label, comm = pc.comm] {
      const NcclApi& a = *options_.api;
      std::unique_lock wait_lock(mutex_);
      wait_until([&] { return a.event_query(event.get()); }, label, wait_lock, comm);
    });
  }
  // Polls `query` (a stream or event) until done; meanwhile the communicator's asynchronous error
  // (a dead peer) and the timeout end the wait with an error instead of a hang. `lock` holds
  // mutex_, released while sleeping so the watchdog can run.
  template <class Query>
  void wait_until(Query query, const std::string& label, std::unique_lock<std::mutex>& lock, ncclComm_t c = nullptr) {
    const NcclApi& api = *options_.api;
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto pause = std::chrono::microseconds(5);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
      throw_if_aborted(label);
      // A point-to-point transfer waited for on a queue thread while the communicator is destroyed
      // (its peer may never come): the destructor must not wait out the timeout for it.
      if (c && c != comm_ && p2p_closing()) detail::throw_error<comm_error>(label, ": the communicator is being destroyed");
      const cudaError_t q = query();
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda(q, "cudaStreamQuery/cudaEventQuery");
      ncclResult_t state = ncclSuccess;
      nccl(api.comm_get_async_error(c ? c : comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) nccl(state, label.c_str());
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        detail::throw_error<timeout_error>(label, " did not finish on the GPU within ",
                                           text::format_ms(static_cast<std::uint64_t>(timeout().count())), " on rank ", rank(),
                                           "; the NCCL communicator was aborted (is another rank stuck or dead?)");
      }
      lock.unlock();
      std::this_thread::sleep_for(pause);
      lock.lock();
    }
  }
  void reserve(const detail::PaddedLayout& l) {
    const NcclApi& api = *options_.api;
    if (l.chunk > send_bytes_) {
      if (send_) (void)api.free(send_), send_ = nullptr;
      cuda(api.malloc(&send_, l.chunk), "cudaMalloc");
      send_bytes_ = l.chunk;
    }
    if (l.total > recv_bytes_) {
      if (recv_) (void)api.free(recv_), recv_ = nullptr;
      cuda(api.malloc(&recv_, l.total), "cudaMalloc");
      recv_bytes_ = l.total;
    }
  }

  // Work enqueued on a stream, followed by the watchdog until its event completes.
  struct InFlight {
    std::shared_ptr<CUevent_st> event;
    std::string label;
    std::chrono::steady_clock::time_point since;
    ncclComm_t comm;  ///< the communicator it runs on (ours, or a point-to-point one)
  };
  static constexpr std::chrono::milliseconds watchdog_period{20};

  // mutex_ guards what the watchdog thread shares with the caller's: comm_ and every NCCL call
  // on it, aborted_, failure_, in_flight_ (waits release it while they sleep).
  std::mutex mutex_;
  std::vector<InFlight> in_flight_;
  std::string failure_;  ///< why the watchdog aborted the communicator
  std::thread watchdog_;
  std::condition_variable watchdog_wake_;
  bool watchdog_stop_ = false;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  std::size_t send_bytes_ = 0, recv_bytes_ = 0;
  bool aborted_ = false;
  std::map<std::pair<int, int>, PairComm> pair_comms_;  ///< (from, to): point-to-point communicators, see p2p_send
  std::string prefix_;  ///< store key prefix of this instance: accel/nccl/<name>/<generation>/
  std::uint64_t generation_ = 0;  ///< this instance's number among communicators of its name (0 for a group's)
#endif
  std::shared_ptr<StoreClient> store_;
  NcclCommOptions options_;
  int device_;
  std::vector<int> members_;  ///< a group's: the job rank of each rank (empty: the job's ranks)
  std::mutex watch_mutex_;                    ///< guards watch_store_
  std::shared_ptr<StoreClient> watch_store_;  ///< see closed()
  detail::StoreP2pSlot store_p2p_;            ///< see store_p2p() (destroyed first: its watcher asks closed())
};

ACCEL_NAMESPACE_END
