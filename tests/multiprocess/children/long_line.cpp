// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for launch tests: prints "rank R begin", one line of BYTES characters written in uneven
// pieces (so it reaches the launcher across many reads), then "rank R end". Usage: long_line BYTES
#include <unistd.h>

#include <cstdlib>
#include <string>

static void put(const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(1, s.data() + done, s.size() - done);
    if (n <= 0) std::_Exit(2);
    done += static_cast<std::size_t>(n);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) return 64;
  const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "?";
  const std::size_t bytes = std::strtoul(argv[1], nullptr, 10);
  put("rank " + rank + " begin\n");
  std::string line;
  for (std::size_t i = 0; i < bytes; ++i) line += static_cast<char>('a' + (i * 7 + rank[0]) % 26);
  for (std::size_t at = 0, piece = 1000; at < line.size(); at += piece, piece = piece * 3 % 50000 + 777) {
    put(line.substr(at, piece));
    if (at % 5 == 0) ::usleep(200);
  }
  put("\nrank " + rank + " end\n");
  return 0;
}
