// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file nccl.hpp
/// @brief NcclCommunicator: collectives between GPU processes over NCCL (the only header that includes nccl.h).
///
/// Bootstrap: rank 0 creates the ncclUniqueId and publishes it through the job's store; the
/// communicator is created non-blocking and every wait polls ncclCommGetAsyncError against the
/// timeout, aborting the communicator when it passes. A round first exchanges headers and payload
/// sizes through the store (sequence check, failure markers), then moves the payloads padded to
/// the largest in one ncclAllGather on a dedicated stream. Without NCCL compiled in the class
/// still exists and its constructor throws unavailable_error.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/comm/communicator.hpp>
#include <accel/comm/store.hpp>
#include <accel/runtime/text.hpp>

#if ACCEL_HAS_NCCL()
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

ACCEL_NAMESPACE_BEGIN

/// @brief Settings of an NcclCommunicator.
struct NcclCommOptions {
  std::string name = "default";  ///< distinguishes several communicators of one job (same on every rank)
};

namespace detail {

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

}  // namespace detail

/// @brief Collectives between GPU processes over NCCL; metadata through the job's store.
class NcclCommunicator final : public Communicator {
 public:
  /// @brief Creates the NCCL communicator. Collective: every rank constructs it with the same name.
  /// @param store the job's store (may be null when size == 1)
  /// @param device this rank's CUDA device (made current for every call)
  /// @param timeout bound on init and every collective
  /// @throws unavailable_error when NCCL is not compiled in or no CUDA device is visible
  /// @throws nccl_error / cuda_error when a call fails; timeout_error when init does not finish in time
  NcclCommunicator(std::shared_ptr<StoreClient> store, int rank, int size, int device, std::chrono::milliseconds timeout,
                   NcclCommOptions options = {})
      : Communicator(rank, size, timeout), store_(std::move(store)), options_(std::move(options)), device_(device) {
#if ACCEL_HAS_NCCL()
    ACCEL_EXPECTS(size == 1 || store_, "NcclCommunicator: a store is required for ", size, " ranks");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      detail::throw_error<unavailable_error>("NCCL needs a CUDA device but none is visible to this process; use the CPU backend "
                                             "(StateOptions::cpu, ACCEL_USE_CPU=1 or ACCEL_COMM_BACKEND=cpu)");
    }
    cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (size > 1) {
      const std::string key = "accel/nccl/" + options_.name + "/id";
      if (rank == 0) store_->set(key, std::as_bytes(std::span<const char>(id.internal, sizeof id.internal)));
      const auto got = store_->get(key);
      if (got.size() != sizeof id.internal)
        detail::throw_error<comm_error>("the ncclUniqueId from the store has ", got.size(), " bytes, ", sizeof id.internal, " expected");
      std::memcpy(id.internal, got.data(), got.size());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so every wait below can be bounded and the communicator aborted
    try {
      nccl(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
      wait_comm("ncclCommInitRankConfig");
      cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
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
#if ACCEL_HAS_NCCL()
    release();
#endif
  }

  [[nodiscard]] std::string backend() const override { return "nccl"; }
  /// @brief The CUDA device this communicator runs on.
  [[nodiscard]] int device() const noexcept { return device_; }

 protected:
  Round exchange(std::uint64_t seq, const std::string& label, std::span<const std::byte> header, const Payload& payload) override {
#if ACCEL_HAS_NCCL()
    if (aborted_) detail::throw_error<comm_error>("the NCCL communicator was aborted after an earlier failure; create a new one");
    // 1. Headers and sizes through the store: every rank learns the same facts, so all skip the
    //    data step together when a rank failed or the ranks are out of step.
    Round r;
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size()));
    if (size() == 1) {
      r.headers.push_back(header);
      sizes[0] = payload.size();
    } else {
      detail::WireWriter w;
      w.bytes(header).u64(payload.size());
      const Blobs all = store_->exchange("accel/nccl/" + options_.name + "/" + std::to_string(seq), rank(), size(), w.take(), label);
      for (std::size_t i = 0; i < all.size(); ++i) {
        detail::WireReader rd(all[i]);
        r.headers.push_back(rd.bytes());
        sizes[i] = rd.u64();
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
    // 2. One padded all-gather on our own stream, then one copy back to the host.
    cuda(cudaSetDevice(device_), "cudaSetDevice");
    reserve(layout);
    auto* send = static_cast<std::byte*>(send_);
    if (!payload.head.empty())
      cuda(cudaMemcpyAsync(send, payload.head.data(), payload.head.size(), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    if (!payload.body.empty())
      cuda(cudaMemcpyAsync(send + payload.head.size(), payload.body.data(), payload.body.size(), cudaMemcpyHostToDevice, stream_),
           "cudaMemcpyAsync");
    nccl(ncclAllGather(send_, recv_, layout.chunk, ncclUint8, comm_, stream_), "ncclAllGather");
    r.payloads.buffer.resize(layout.total);
    cuda(cudaMemcpyAsync(r.payloads.buffer.data(), recv_, layout.total, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    wait_stream(label);
    for (std::size_t i = 0; i < sizes.size(); ++i)
      r.payloads.offset.push_back(i * layout.chunk), r.payloads.length.push_back(static_cast<std::size_t>(sizes[i]));
    return r;
#else
    (void)seq, (void)label, (void)header, (void)payload;
    detail::throw_error<unavailable_error>("NCCL is not compiled in");
#endif
  }

 private:
#if ACCEL_HAS_NCCL()
  void cuda(cudaError_t rc, const char* call) {
    if (rc == cudaSuccess) return;
    (void)cudaGetLastError();
    throw cuda_error(static_cast<int>(rc), detail::concat(call, " failed on device ", device_, ": ", cudaGetErrorName(rc), ": ",
                                                          cudaGetErrorString(rc)));
  }
  void nccl(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    abort();
    throw nccl_error(static_cast<int>(rc), detail::concat(call, " failed on rank ", rank(), ": ", ncclGetErrorString(rc),
                                                          last && *last ? detail::concat(" (", last, ")") : std::string()));
  }
  // Marks the communicator unusable; release() then aborts it instead of finalizing.
  void abort() noexcept { aborted_ = comm_ != nullptr; }
  void release() noexcept {
    if (stream_) cudaStreamDestroy(stream_), stream_ = nullptr;
    if (send_) cudaFree(send_), send_ = nullptr;
    if (recv_) cudaFree(recv_), recv_ = nullptr;
    if (!comm_) return;
    const ncclResult_t fin = aborted_ ? ncclInternalError : ncclCommFinalize(comm_);
    if (fin == ncclSuccess || fin == ncclInProgress) {
      // Non-blocking finalize: bounded wait for pending work to flush, then destroy; abort otherwise.
      ncclResult_t state = ncclInProgress;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (state == ncclSuccess) {
        ncclCommDestroy(comm_);
        comm_ = nullptr;
        return;
      }
    }
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  // Polls the communicator's asynchronous state until it leaves ncclInProgress, within the timeout.
  void wait_comm(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto pause = std::chrono::microseconds(10);; pause = std::min(pause * 2, std::chrono::microseconds(2000))) {
      ncclResult_t state = ncclInProgress;
      nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
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
  void wait_stream(const std::string& label) {
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto pause = std::chrono::microseconds(5);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda(q, "cudaStreamQuery");
      ncclResult_t state = ncclSuccess;
      nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) nccl(state, label.c_str());
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        detail::throw_error<timeout_error>(label, " did not finish on the GPU within ",
                                           text::format_ms(static_cast<std::uint64_t>(timeout().count())), " on rank ", rank(),
                                           "; the NCCL communicator was aborted (is another rank stuck or dead?)");
      }
      std::this_thread::sleep_for(pause);
    }
  }
  void reserve(const detail::PaddedLayout& l) {
    if (l.chunk > send_bytes_) {
      if (send_) cudaFree(send_), send_ = nullptr;
      cuda(cudaMalloc(&send_, l.chunk), "cudaMalloc");
      send_bytes_ = l.chunk;
    }
    if (l.total > recv_bytes_) {
      if (recv_) cudaFree(recv_), recv_ = nullptr;
      cuda(cudaMalloc(&recv_, l.total), "cudaMalloc");
      recv_bytes_ = l.total;
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  std::size_t send_bytes_ = 0, recv_bytes_ = 0;
  bool aborted_ = false;
#endif
  std::shared_ptr<StoreClient> store_;
  NcclCommOptions options_;
  int device_;
};

ACCEL_NAMESPACE_END
