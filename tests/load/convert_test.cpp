// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Exhaustive checks of the fp16/bf16/fp32 conversions against a reference computed in double.
#include <accel/load/convert.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/catch.hpp"

namespace {

// Reference decoders straight from the format definitions, in double.
double ref_half(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0x1f) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(m, -24);
  else v = std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}
double ref_bf16(std::uint16_t b) {
  const int s = b >> 15, e = (b >> 7) & 0xff, m = b & 0x7f;
  double v;
  if (e == 0xff) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) v = std::ldexp(m, -133);
  else v = std::ldexp(128 + m, e - 134);
  return s ? -v : v;
}

// Reference encoder: the nearest finite value of the 16-bit format among its non-negative
// patterns (ties to the even pattern), Inf when |x| reaches the overflow threshold.
struct RefEncoder {
  std::vector<std::pair<double, std::uint16_t>> values;  // finite non-negative, ascending
  double overflow;                                        // |x| >= this rounds to Inf
  std::uint16_t inf;
  explicit RefEncoder(double (*decode)(std::uint16_t), std::uint16_t inf_bits) : inf(inf_bits) {
    for (std::uint32_t b = 0; b < inf_bits; ++b) values.emplace_back(decode(static_cast<std::uint16_t>(b)), static_cast<std::uint16_t>(b));
    const double max = values.back().first, below = values[values.size() - 2].first;
    overflow = max + (max - below) / 2;  // the tie at the midpoint to 2^(emax+1) goes to Inf (odd max)
  }
  std::uint16_t encode(float f) const {
    const double x = std::fabs(static_cast<double>(f));
    const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (x >= overflow) return sign | inf;
    auto it = std::lower_bound(values.begin(), values.end(), x, [](const auto& p, double v) { return p.first < v; });
    if (it == values.end()) return sign | values.back().second;  // between the max and the threshold
    if (it->first == x) return sign | it->second;
    auto lo = it - 1;
    const double dlo = x - lo->first, dhi = it->first - x;
    if (dlo < dhi) return sign | lo->second;
    if (dhi < dlo) return sign | it->second;
    return sign | ((lo->second & 1) ? it->second : lo->second);
  }
};

std::vector<float> probe_floats() {
  std::vector<float> out;
  // every 16-bit pattern shifted into float space, plus neighbours: covers every midpoint and tie
  for (std::uint32_t hi = 0; hi < 65536; ++hi) {
    const std::uint32_t base = hi << 16;
    for (std::uint32_t low : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) out.push_back(accel::bits_float(base | low));
  }
  for (std::uint32_t h = 0; h < 65536; ++h) {  // binary16 values and their float-space midpoints
    const float v = accel::half_to_float(static_cast<std::uint16_t>(h));
    const std::uint32_t u = accel::float_bits(v);
    for (std::uint32_t d : {0x0fffu, 0x1000u, 0x1001u}) {
      out.push_back(accel::bits_float(u + d));
      out.push_back(accel::bits_float(u - d));
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) out.push_back(accel::bits_float(static_cast<std::uint32_t>(rng())));
  return out;
}

}  // namespace

TEST_CASE("half_to_float decodes all 65536 binary16 patterns exactly", "[convert]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const double ref = ref_half(b);
    const float got = accel::half_to_float(b);
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(got));
      REQUIRE(std::signbit(got) == bool(h & 0x8000));
    } else {
      REQUIRE(static_cast<double>(got) == ref);
      REQUIRE(std::signbit(got) == bool(h & 0x8000));  // -0 stays -0
    }
  }
}

TEST_CASE("bf16_to_float decodes all 65536 bfloat16 patterns exactly", "[convert]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const double ref = ref_bf16(b);
    const float got = accel::bf16_to_float(b);
    if (std::isnan(ref)) REQUIRE(std::isnan(got));
    else REQUIRE(static_cast<double>(got) == ref);
  }
}

TEST_CASE("every binary16 and bfloat16 value round-trips through float32 bit for bit", "[convert]") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const bool half_nan = ((b & 0x7c00) == 0x7c00) && (b & 0x3ff);
    const bool bf_nan = ((b & 0x7f80) == 0x7f80) && (b & 0x7f);
    if (!half_nan || (b & 0x200)) REQUIRE(accel::float_to_half(accel::half_to_float(b)) == b);  // quiet NaNs too
    else REQUIRE((accel::float_to_half(accel::half_to_float(b)) | 0x200) == (b | 0x200));      // signalling: quietened
    if (!bf_nan || (b & 0x40)) REQUIRE(accel::float_to_bf16(accel::bf16_to_float(b)) == b);
    else REQUIRE((accel::float_to_bf16(accel::bf16_to_float(b)) | 0x40) == (b | 0x40));
  }
}

TEST_CASE("float_to_half rounds to nearest even exactly like the reference on every midpoint", "[convert]") {
  const RefEncoder ref(ref_half, 0x7c00);
  std::uint64_t checked = 0;
  for (float f : probe_floats()) {
    if (std::isnan(f)) {
      const auto h = accel::float_to_half(f);
      REQUIRE((h & 0x7c00) == 0x7c00);
      REQUIRE((h & 0x3ff) != 0);
      REQUIRE(bool(h & 0x8000) == std::signbit(f));
      continue;
    }
    const auto want = ref.encode(f), got = accel::float_to_half(f);
    if (want != got) FAIL("float bits " << std::hex << accel::float_bits(f) << ": want " << want << " got " << got);
    ++checked;
  }
  REQUIRE(checked > 500000);
}

TEST_CASE("float_to_bf16 rounds to nearest even exactly like the reference", "[convert]") {
  const RefEncoder ref(ref_bf16, 0x7f80);
  for (float f : probe_floats()) {
    if (std::isnan(f)) {
      const auto b = accel::float_to_bf16(f);
      REQUIRE((b & 0x7f80) == 0x7f80);
      REQUIRE((b & 0x7f) != 0);
      continue;
    }
    const auto want = ref.encode(f), got = accel::float_to_bf16(f);
    if (want != got) FAIL("float bits " << std::hex << accel::float_bits(f) << ": want " << want << " got " << got);
  }
}

TEST_CASE("half and bfloat16 convert into each other through one rounding, for all 65536 inputs", "[convert]") {
  const RefEncoder to_half(ref_half, 0x7c00), to_bf(ref_bf16, 0x7f80);
  std::vector<std::uint16_t> all(65536), out(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  auto* src = reinterpret_cast<const std::byte*>(all.data());
  auto* dst = reinterpret_cast<std::byte*>(out.data());
  accel::convert_elements(accel::DType::F16, accel::DType::BF16, src, dst, 65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const float f = accel::half_to_float(all[i]);
    if (std::isnan(f)) REQUIRE(std::isnan(accel::bf16_to_float(out[i])));
    else REQUIRE(out[i] == to_bf.encode(f));
  }
  accel::convert_elements(accel::DType::BF16, accel::DType::F16, src, dst, 65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const float f = accel::bf16_to_float(all[i]);
    if (std::isnan(f)) REQUIRE(std::isnan(accel::half_to_float(out[i])));
    else REQUIRE(out[i] == to_half.encode(f));
  }
}

TEST_CASE("convert_elements matches the scalar functions for float32 sources and destinations", "[convert]") {
  const std::vector<float> in{0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e-8f, 5.96e-8f, -3.14159f,
                              std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()};
  std::vector<std::uint16_t> h(in.size()), b(in.size());
  std::vector<float> back(in.size());
  accel::convert_elements(accel::DType::F32, accel::DType::F16, reinterpret_cast<const std::byte*>(in.data()),
                          reinterpret_cast<std::byte*>(h.data()), in.size());
  accel::convert_elements(accel::DType::F32, accel::DType::BF16, reinterpret_cast<const std::byte*>(in.data()),
                          reinterpret_cast<std::byte*>(b.data()), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    REQUIRE(h[i] == accel::float_to_half(in[i]));
    REQUIRE(b[i] == accel::float_to_bf16(in[i]));
  }
  REQUIRE(h[4] == 0x7c00);  // 65520 is the tie that rounds to Inf
  REQUIRE(h[3] == 0x7bff);
  accel::convert_elements(accel::DType::F16, accel::DType::F32, reinterpret_cast<const std::byte*>(h.data()),
                          reinterpret_cast<std::byte*>(back.data()), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) REQUIRE(back[i] == accel::half_to_float(h[i]));
}

TEST_CASE("integer tensors are never converted and unsupported pairs are refused by name", "[convert]") {
  using accel::DType;
  REQUIRE(accel::load_dtype(DType::I64, DType::F16, false) == DType::I64);
  REQUIRE(accel::load_dtype(DType::BOOL, DType::F16, true) == DType::BOOL);
  REQUIRE(accel::load_dtype(DType::U8, std::nullopt, true) == DType::U8);
  REQUIRE(accel::load_dtype(DType::F32, DType::F16, false) == DType::F16);
  REQUIRE(accel::load_dtype(DType::F32, DType::F16, true) == DType::F32);
  REQUIRE(accel::load_dtype(DType::BF16, DType::F16, true) == DType::F32);
  REQUIRE(accel::load_dtype(DType::F16, std::nullopt, false) == DType::F16);
  REQUIRE_THROWS_WITH(accel::load_dtype(DType::F8_E4M3, DType::F16, false, "w"),
                      accel_test::contains("tensor 'w' is F8_E4M3 and cannot be loaded as F16"));
  std::byte buf[8]{};
  REQUIRE_THROWS_WITH(accel::convert_elements(DType::I32, DType::F32, buf, buf + 4, 1),
                      accel_test::contains("cannot convert I32 to F32"));
}
