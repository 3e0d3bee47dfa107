#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Pipeline stage imbalance: `accel plan --stages S` against the split balanced by parameter count.

For every catalog architecture at its published size (the header-only checkpoints described by
tests/compat/fixtures/golden_maps_published, written as compare_golden_maps.py writes them, in
bfloat16), S = 2, 4, 8 stages and two budgets per stage process:

  fits   one GPU as large as the whole model, cpu as large again (nothing streams);
  tight  one GPU holding 90 % of an even share (model / S), cpu the model, disk unbounded
         (a stage with more than its share streams at the default rates);

runs

    accel plan --checkpoint DIR --dtype bfloat16 --stages S --max-memory ... --json

and reports the imbalance (estimated slowest stage / mean stage) of accel's split and of the
split balanced by parameter count (accelerate's split_points="auto"), both placed and timed by
the same cost model, and how much slower the parameter split's slowest stage is (median, p90,
max), and in how many cases accel's imbalance is the higher one (the slowest stage is what bounds a
pipeline's throughput; a split that streams on more stages raises its mean, which lowers its
imbalance without making it faster). It checks that accel's slowest stage is never slower than
the parameter split's.
An architecture with fewer units than S (blocks, modules without children) is skipped for that S.

Usage: stage_imbalance.py ACCEL_BINARY [ARCHITECTURE...]      (python3 only, no torch)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COMPAT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "compat")
sys.path.insert(0, COMPAT)
from gen_golden_maps import read_fixture, write_checkpoint_files  # noqa: E402  (pure Python; needs no torch)

sys.path.insert(0, HERE)
from objective_bytes import quantile  # noqa: E402

FIXTURES = os.path.join(COMPAT, "fixtures", "golden_maps_published")
STAGES = (2, 4, 8)
RATES = "cpu=25GB/s,disk=2GB/s"


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr.strip()


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) > 1 else 2
    accel = os.path.abspath(sys.argv[1])
    wanted = set(sys.argv[2:])
    results = {}  # (scenario, S) -> list of (arch, ours, baseline, slowdown)
    failures, skipped = [], []
    print(f"{'architecture':42} {'budget':>6} {'S':>2} {'units':>5} {'accel':>7} {'params':>7} {'slower':>7}")
    for file in sorted(os.listdir(FIXTURES)):
        fixture = read_fixture(os.path.join(FIXTURES, file))
        arch = fixture["architecture"]
        if wanted and arch not in wanted:
            continue
        tensors = [(n, "BF16", shape) for n, shape in fixture["tensors"]]
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(fixture["config"], f)
            write_checkpoint_files(folder, tensors)
            base = [accel, "plan", "--checkpoint", folder, "--dtype", "bfloat16", "--bandwidth", RATES, "--json"]
            # The model's size as the stages count it: one stage on a huge GPU.
            code, out, err = run(base + ["--stages", "1", "--max-memory", json.dumps({"0": 1 << 60, "cpu": 1 << 60})])
            if code != 0:
                failures.append(f"{arch}: accel plan --stages 1 failed ({code}): {err}")
                continue
            total = json.loads(out)["stages"][0]["bytes"]
            for S in STAGES:
                for scenario, budgets in (("fits", {"0": total, "cpu": total}),
                                          ("tight", {"0": int(0.9 * total / S), "cpu": total})):
                    code, out, err = run(base + ["--stages", str(S), "--max-memory", json.dumps(budgets)])
                    if code == 2 and "units a stage boundary may fall between" in err:
                        skipped.append(f"{arch} S={S}")
                        break
                    if code != 0:
                        failures.append(f"{arch} S={S} {scenario}: accel plan failed ({code}): {err}")
                        continue
                    j = json.loads(out)
                    base_split = j["parameter_split"]
                    if base_split["problem"]:
                        failures.append(f"{arch} S={S} {scenario}: the parameter split does not fit: {base_split['problem']}")
                        continue
                    ours, theirs = j["slowest_seconds"], max(base_split["seconds"])
                    if ours > theirs * (1 + 1e-9):
                        failures.append(f"{arch} S={S} {scenario}: slowest stage {ours:.6g} s, the parameter split's {theirs:.6g} s")
                    slower = theirs / ours if ours > 0 else 1.0
                    results.setdefault((scenario, S), []).append((arch, j["imbalance"], base_split["imbalance"], slower))
                    print(f"{arch:42} {scenario:>6} {S:>2} {len(j['units']):>5} {j['imbalance']:>7.3f} "
                          f"{base_split['imbalance']:>7.3f} {slower:>6.3f}x")
    print("\nimbalance = estimated slowest stage / mean stage; 'slower' = the parameter split's slowest stage / accel's;")
    print("'imb. higher': rows where accel's imbalance is the higher one although its slowest stage is not slower (the")
    print("parameter split's mean is raised by stages that stream weights accel's split keeps on the GPU)")
    print(f"{'budget':>6} {'S':>2} {'archs':>5} {'accel median':>12} {'accel max':>9} {'params median':>13} {'params max':>10} "
          f"{'slower median':>13} {'p90':>6} {'max':>6} {'faster in':>9} {'imb. higher':>11}")
    for (scenario, S), rows in sorted(results.items()):
        ours = [r[1] for r in rows]
        theirs = [r[2] for r in rows]
        slower = [r[3] for r in rows]
        worst = max(rows, key=lambda r: r[3])
        print(f"{scenario:>6} {S:>2} {len(rows):>5} {quantile(ours, 0.5):>12.3f} {max(ours):>9.3f} {quantile(theirs, 0.5):>13.3f} "
              f"{max(theirs):>10.3f} {quantile(slower, 0.5):>12.3f}x {quantile(slower, 0.9):>5.3f}x {max(slower):>5.3f}x "
              f"{sum(s > 1 + 1e-9 for s in slower):>4}/{len(rows)} {sum(r[1] > r[2] + 1e-9 for r in rows):>11}  (max: {worst[0]})")
    if skipped:
        print(f"skipped (fewer units than stages): {', '.join(skipped)}")
    for f in failures:
        print("FAIL " + f)
    print("check: accel's slowest stage is never slower than the parameter split's: " + ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
