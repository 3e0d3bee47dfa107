// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file pmi.hpp
/// @brief Who serves PMI_FD: the one job identity MPICH's Hydra offers without speaking PMI.
///
/// Hydra (MPICH 4.0, checked) puts no job identity in the environment: only PMI_FD, PMI_RANK,
/// PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS and HYDI_CONTROL_FD (the same numbers in every job).
/// Its KVS name is only told over PMI, and any PMI message marks the process as a PMI application,
/// whose exit without `cmd=finalize` makes the proxy kill the job's other processes (seen: rank 0
/// killed when rank 1 exited first), while a finalize would leave an MPI library in the same
/// process without PMI. So accel never writes to PMI_FD; it reads the socket's peer instead: the
/// job's hydra_pmi_proxy, one per job and machine.
#pragma once

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <string>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief "<host>/<pid>" of the process at the other end of the Unix socket `fd` (SO_PEERCRED:
///        the process that created the socket pair), or nullopt when `fd` is not such a socket.
inline std::optional<std::string> unix_socket_peer(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred || cred.pid <= 0) return std::nullopt;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host[0] ? host : "localhost") + "/" + std::to_string(cred.pid);
}

}  // namespace detail
ACCEL_NAMESPACE_END
