// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for launch tests: writes lines in two pieces with a pause between them (so unbuffered merging
// would mix ranks inside a line), a line on stderr, and ends with an unterminated line.
#include <unistd.h>

#include <cstdlib>
#include <string>

static void put(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) std::_Exit(2);
    done += static_cast<std::size_t>(n);
  }
}

int main(int argc, char** argv) {
  const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "?";
  const int lines = argc > 1 ? std::atoi(argv[1]) : 20;
  for (int i = 0; i < lines; ++i) {
    put(1, "rank " + rank + " line " + std::to_string(i) + " " + std::string(40, 'a'));
    ::usleep(2000);
    put(1, std::string(40, 'b') + "\n");
  }
  put(2, "to stderr from rank " + rank + "\n");
  put(1, "tail of rank " + rank);  // no newline: the launcher must still show it, whole
  return 0;
}
