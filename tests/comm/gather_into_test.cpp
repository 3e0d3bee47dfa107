// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// gather_object_into and from_bytes_into: decoding into storage the caller keeps, reusing it.
#include <accel/comm/collectives.hpp>
#include <accel/comm/serialize.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/thread_world.hpp"

namespace demo_into {

struct Record {
  std::int64_t id = 0;
  float score = 0;
  std::string text;
  std::vector<std::int32_t> tokens;
  friend bool operator==(const Record&, const Record&) = default;
};
ACCEL_DEFINE_FIELDS(Record, id, score, text, tokens)

}  // namespace demo_into

namespace {

using demo_into::Record;

std::vector<Record> records(int rank, std::size_t n, int call) {
  std::vector<Record> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::int32_t>(i);
    v[i] = {rank * 1'000'000 + static_cast<std::int64_t>(i), 0.5f * static_cast<float>(k + call),
            "completion text for prompt " + std::to_string(rank * 1000 + k) + "/" + std::to_string(call), {1, 2, call, k}};
  }
  return v;
}

}  // namespace

TEST_CASE("gather_object_into: the same values as gather_object, call after call, as record counts grow and shrink",
          "[collectives][into]") {
  for (int n : accel_test::world_sizes)
    accel_test::run_world_ok(n, [n](accel::Communicator& comm) {
      std::vector<std::vector<Record>> out(5);  // starts with the wrong number of parts
      for (int call = 0; call < 4; ++call) {
        const std::size_t count = static_cast<std::size_t>(comm.rank() * 3 + (call == 2 ? 1 : 20 + call));
        const auto mine = records(comm.rank(), count, call);
        accel::gather_object_into(comm, mine, out);
        const auto expected = accel::gather_object(comm, mine);
        ACCEL_TEST_ENSURE(out.size() == static_cast<std::size_t>(n));
        ACCEL_TEST_ENSURE(out == expected);
      }
    });
}

TEST_CASE("gather_object_into: a second gather of the same shape reuses every buffer of the first", "[collectives][into]") {
  accel_test::run_world_ok(2, [](accel::Communicator& comm) {
    std::vector<std::vector<Record>> out;
    accel::gather_object_into(comm, records(comm.rank(), 50, 0), out);
    // Where the first call's memory is: the part vectors, each record's string and tokens.
    std::vector<const void*> before;
    for (const auto& part : out) {
      before.push_back(part.data());
      for (const auto& r : part) before.push_back(r.text.data()), before.push_back(r.tokens.data());
    }
    const auto second = records(comm.rank(), 50, 1);  // other contents, the same shape
    accel::gather_object_into(comm, second, out);
    std::size_t at = 0;
    for (const auto& part : out) {
      ACCEL_TEST_ENSURE(before[at++] == part.data());
      for (const auto& r : part) {
        ACCEL_TEST_ENSURE(before[at++] == static_cast<const void*>(r.text.data()));
        ACCEL_TEST_ENSURE(before[at++] == static_cast<const void*>(r.tokens.data()));
      }
    }
    ACCEL_TEST_ENSURE(out[static_cast<std::size_t>(comm.rank())] == second);
  });
}

TEST_CASE("from_bytes_into: raw vectors, strings and string vectors decode into the memory they hold", "[serialize][into]") {
  std::vector<std::int64_t> numbers(1000, 7);
  const auto* numbers_at = numbers.data();
  accel::from_bytes_into(accel::to_bytes(std::vector<std::int64_t>(900, 3)), numbers);
  REQUIRE(numbers == std::vector<std::int64_t>(900, 3));
  REQUIRE(numbers.data() == numbers_at);

  std::string text(100, 'x');
  const auto* text_at = text.data();
  accel::from_bytes_into(accel::to_bytes(std::string(80, 'y')), text);
  REQUIRE(text == std::string(80, 'y'));
  REQUIRE(text.data() == text_at);

  std::vector<std::string> lines = {std::string(40, 'a'), std::string(40, 'b')};
  const auto* line_at = lines[1].data();
  accel::from_bytes_into(accel::to_bytes(std::vector<std::string>{std::string(30, 'c'), std::string(30, 'd')}), lines);
  REQUIRE(lines == std::vector<std::string>{std::string(30, 'c'), std::string(30, 'd')});
  REQUIRE(lines[1].data() == line_at);
}

TEST_CASE("gather_object_into: a rank that passes another type is named on every rank", "[collectives][into]") {
  const auto errors = accel_test::run_world(2, [](accel::Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<std::vector<Record>> out;
      accel::gather_object_into(comm, records(0, 3, 0), out);
    } else {
      std::vector<std::vector<std::int64_t>> out;
      accel::gather_object_into(comm, std::vector<std::int64_t>{1, 2}, out);
    }
  });
  REQUIRE_THAT(accel_test::message(errors[0]), accel_test::contains("from rank 1"));
  REQUIRE_THAT(accel_test::message(errors[1]), accel_test::contains("from rank 0"));
}
