// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file run.hpp
/// @brief `launch::run`: what `accel launch` does once its command line is parsed. Three steps,
///        in order: set the job up (plan, program, logs, store), start and supervise this
///        machine's processes, report how the job ended.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <accel/comm/shm_cleanup.hpp>
#include <accel/launch/detail/adoption.hpp>
#include <accel/launch/detail/process.hpp>
#include <accel/launch/detail/supervisor.hpp>
#include <accel/launch/launch_plan.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/devices.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
namespace launch {
namespace detail {

using Say = std::function<void(const std::string&)>;

inline std::optional<std::string> getenv_opt(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

/// @brief A job ready to start: its plan (store address included), the program's full path, and
///        the open-file limit its processes start with when the launcher raised its own.
struct PreparedJob {
  LaunchPlan plan;
  std::string program_path;
  std::optional<rlimit> child_open_files{};
};

/// @brief Raises the launcher's soft open-file limit when the job needs more descriptors than it
///        allows (raised_open_file_limit decides); returns the limit the children start with.
/// @throws launch_error before anything starts when even the hard limit is too low
inline std::optional<rlimit> fit_open_file_limit(const LaunchPlan& plan, const LaunchOptions& options, bool hosts_store,
                                                 const Say& say) {
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0) return std::nullopt;
  const auto needed = launcher_open_files(plan, options, hosts_store);
  const auto raised = raised_open_file_limit(needed, now.rlim_cur, now.rlim_max, plan.ranks.size());
  if (!raised) return std::nullopt;
  rlimit more = now;
  more.rlim_cur = static_cast<rlim_t>(*raised);
  if (::setrlimit(RLIMIT_NOFILE, &more) != 0)
    accel::detail::throw_error<launch_error>("cannot raise the open-file limit from ", now.rlim_cur, " to ", *raised, " (",
                                             accel::detail::proc::errno_text(errno), "); this job needs about ", needed,
                                             "; raise it before starting (ulimit -n)");
  say(accel::detail::concat("raised the open-file limit from ", now.rlim_cur, " to ", *raised, ": the launcher holds about ",
                            needed, " for this job; its processes start with ", now.rlim_cur));
  return now;
}

/// @brief Step 1, setup: plans the job for this machine (saying the checklist's warnings), finds
///        the program, creates the log folder, hosts the store and fits the open-file limit.
inline PreparedJob prepare_job(const LaunchOptions& options, const LaunchHooks& hooks, const Say& say) {
  using accel::detail::concat;
  namespace proc = accel::detail::proc;
  LaunchInputs in;
  in.cuda_visible_devices = getenv_opt("CUDA_VISIBLE_DEVICES");
  if (!options.cpu) {
    const DeviceList list = default_device_query().list(false);
    in.gpu_count = static_cast<int>(list.gpus.size());
    in.gpu_status = list.status;
  }
  if (options.num_machines == 1 && options.main_process_port.value_or(0) == 0) in.free_port = proc::pick_free_port();
  in.fresh_job_token = proc::random_hex(16);
  in.env_job_token = getenv_opt("ACCEL_JOB_TOKEN");
  in.env_gpus_per_process = getenv_opt("ACCEL_GPUS_PER_PROCESS");
  PreparedJob job{plan_launch(options, in), {}};
  for (const auto& w : job.plan.warnings) say("warning: " + w);

  const std::string& program = options.command.front();
  const std::string path_var = getenv_opt("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  job.program_path = proc::find_program(program, path_var);
  if (job.program_path.empty()) {
    // Something by that name that cannot run (not executable, a folder) is named as such, not as missing.
    if (auto reason = proc::unrunnable_reason(program, path_var); !reason.empty())
      accel::detail::throw_error<launch_error>("cannot run the program '", program, "': ", reason);
    accel::detail::throw_error<launch_error>("cannot find the program '", program, "'",
                                             program.find('/') != std::string::npos
                                                 ? ": no file at that path"
                                                 : concat(" on PATH; give its path, e.g. ./", program));
  }
  if (options.log_dir) make_directories(*options.log_dir);
  bool hosts_store = false;
  if (hooks.host_store)
    if (auto address = hooks.host_store(job.plan)) {
      set_store_address(job.plan, *address);
      hosts_store = true;
    }
  job.child_open_files = fit_open_file_limit(job.plan, options, hosts_store, say);
  return job;
}

/// @brief The output of one child when it is piped (--tee, --log_dir): the supervisor's read ends
///        (with log files), and the write ends the child inherits, held until it has started.
struct ChildOutput {
  std::vector<Stream> streams;
  std::vector<accel::detail::proc::UniqueFd> write_ends;
};

/// @brief Pipes stdout and stderr of one child to the supervisor (and opens its log files).
inline ChildOutput child_output(const LaunchOptions& options, int rank, accel::detail::proc::SpawnRequest& req) {
  namespace proc = accel::detail::proc;
  ChildOutput mine;
  if (!options.tee && !options.log_dir) return mine;
  proc::Pipe out = proc::make_pipe(), err = proc::make_pipe();
  req.stdout_fd = out.write_end.get();
  req.stderr_fd = err.write_end.get();
  for (int which : {1, 2}) {
    Stream s;
    s.pipe = std::move(which == 1 ? out.read_end : err.read_end);
    s.rank = rank;
    s.console = which;
    if (options.log_dir) {
      const std::string file = accel::detail::concat(*options.log_dir, "/rank_", rank, which == 1 ? ".stdout.log" : ".stderr.log");
      s.log.reset(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
      if (!s.log)
        accel::detail::throw_error<launch_error>("cannot create the log file '", file, "' (", proc::errno_text(errno),
                                                 "); choose another --log_dir");
    }
    mine.streams.push_back(std::move(s));
  }
  mine.write_ends.push_back(std::move(out.write_end));
  mine.write_ends.push_back(std::move(err.write_end));
  return mine;
}

/// @brief Step 2a: starts this machine's processes, each in its own process group, and hands
///        them and their output streams to the supervisor.
inline void start_children(const PreparedJob& job, const LaunchOptions& options, const accel::detail::proc::BlockedSignals& signals,
                           Supervisor& sup) {
  namespace proc = accel::detail::proc;
  std::vector<std::string> parent_env;
  for (char** e = environ; e && *e; ++e) parent_env.emplace_back(*e);
  proc::UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // The launcher's stdin goes to local rank 0 when it is a file or pipe; a terminal would stop a
  // child of another process group with SIGTTIN, so then everyone reads /dev/null.
  const bool pass_stdin = !::isatty(0);
  for (const auto& r : job.plan.ranks) {
    proc::SpawnRequest req;
    req.path = job.program_path;
    req.argv = options.command;
    req.env = child_environment(job.plan, r, parent_env);
    req.stdin_fd = r.local_rank == 0 && pass_stdin ? -1 : devnull.get();
    req.child_mask = signals.original_mask();
    req.reset_signals = signals.reset_list();
    req.exit_watch = sup.exit_watch();
    req.open_files = job.child_open_files;
    auto output = child_output(options, r.rank, req);
    proc::Spawned started = proc::spawn_child(req);
    Child child;
    child.rank = r.rank;
    child.local_rank = r.local_rank;
    child.pid = started.pid;
    child.pidfd = std::move(started.pidfd);
    sup.children.push_back(std::move(child));
    for (auto& s : output.streams) sup.streams.push_back(std::move(s));
    // output.write_ends close here: from now on only the child holds them, so its exit ends the stream.
  }
}

}  // namespace detail

/// @brief Runs a job: plans it (printing the checklist's warnings), starts this machine's processes,
/// supervises them and returns the status the launcher should exit with.
///
/// Supervision: when a child fails (non-zero exit or a signal) every other child's process group gets
/// SIGTERM, then SIGKILL after `grace_s`; SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher are
/// forwarded the same way (a second one kills at once). Children run in their own process groups with
/// SIGKILL as parent-death signal, so none outlives the launcher, even a SIGKILLed one.
/// @param options the parsed command line
/// @param hooks optional effects (the store, where messages go)
/// @return 0 when every child exited with 0; the first failed child's exit code (128 + signal number
///         when a signal killed it); 128 + the signal when the launcher was interrupted
/// @throws usage_error, config_error from planning; launch_error when a child cannot be started
/// @note Blocks until the job ends. Changes the calling thread's signal mask while it runs (restored
///       on return); call it from the main thread before starting other threads.
inline int run(const LaunchOptions& options, const LaunchHooks& hooks = {}) {
  const detail::Say say = hooks.message ? hooks.message : detail::Say([](const std::string& m) {
    accel::detail::proc::write_all(2, "accel launch: " + m + "\n");
  });
  // Block first: threads started from here on (CUDA's, the store's) inherit the mask.
  accel::detail::proc::BlockedSignals signals({SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT});
  const detail::PreparedJob job = detail::prepare_job(options, hooks, say);
  // Whatever the ranks start and leave behind is reparented to us, not to init, so that the
  // supervisor can end it with the job.
  const accel::detail::proc::ChildSubreaper subreaper;
  detail::Supervisor sup(signals, options.grace_s, options.tee, say, hooks.store_departures);
  try {
    detail::start_children(job, options, signals, sup);
  } catch (...) {
    sup.abort_start();
    throw;
  }
  sup.supervise();
  // A rank killed before its communicator ended (SIGKILL, or the SIGTERM that stops the rest of a
  // failed job) leaves its shared-memory segments; nobody else would unlink them.
  std::vector<pid_t> pids;
  for (const auto& c : sup.children) pids.push_back(c.pid);
  if (const std::size_t n = accel::remove_shm_segments_of(pids))
    say(accel::detail::concat("removed ", n, n == 1 ? " shared-memory segment" : " shared-memory segments",
                              " the job's processes left in /dev/shm"));
  return sup.report();
}

}  // namespace launch
ACCEL_NAMESPACE_END
