#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Bytes streamed per forward pass: `accel plan --objective fit` against `--objective speed`.

For every catalog architecture at its published size (the header-only checkpoints described by
tests/compat/fixtures/golden_maps_published, written as compare_golden_maps.py writes them, in
bfloat16) and five budgets (two GPUs holding together 25 %, 50 %, 75 %, 90 % or 100 % of the
model, cpu half of the rest, disk unbounded for the remainder), runs

    accel plan --checkpoint DIR --max-memory ... --json-report --objective fit|speed

and reports the bytes each objective streams per pass, the ratio fit/speed (median, p75, p90),
how many scenarios stream nothing under speed, and checks that speed never streams more than fit
and that no speed map puts more on a device than its budget (checked here from the tensors'
shapes, not from accel's accounting).

Usage: objective_bytes.py ACCEL_BINARY [ARCHITECTURE...]      (python3 only, no torch)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COMPAT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "compat")
sys.path.insert(0, COMPAT)
from compare_golden_maps import keep_in_fp32_by_architecture, over_budget  # noqa: E402  (pure Python; needs no torch)
from gen_golden_maps import read_fixture, write_checkpoint_files  # noqa: E402

FIXTURES = os.path.join(COMPAT, "fixtures", "golden_maps_published")
GPU_SHARES = (0.25, 0.50, 0.75, 0.90, 1.00)


def quantile(values, q):
    """The q-quantile by linear interpolation (numpy's default)."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def plan(accel, folder, budgets, objective):
    cmd = [accel, "plan", "--checkpoint", folder, "--dtype", "bfloat16", "--max-memory", json.dumps(budgets),
           "--json-report", "--objective", objective, "--bandwidth", "cpu=25GB/s,disk=2GB/s"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr.strip()}")
    return json.loads(run.stdout)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) > 1 else 2
    accel = os.path.abspath(sys.argv[1])
    wanted = set(sys.argv[2:])
    fp32 = keep_in_fp32_by_architecture()
    ratios, failures = [], []
    rows = nothing = scenarios = 0
    print(f"{'architecture':42} {'GPUs':>5} {'fit':>11} {'speed':>11} {'fit/speed':>9}")
    for file in sorted(os.listdir(FIXTURES)):
        fixture = read_fixture(os.path.join(FIXTURES, file))
        arch = fixture["architecture"]
        if wanted and arch not in wanted:
            continue
        tensors = [(n, "BF16", shape) for n, shape in fixture["tensors"]]
        renamed = fixture.get("renamed", {})
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(fixture["config"], f)
            write_checkpoint_files(folder, tensors)
            # The model's size as accel counts it (everything on one huge GPU).
            total = plan(accel, folder, {"0": 1 << 60}, "fit")["total_bytes"]
            for share in GPU_SHARES:
                gpu = int(total * share / 2)
                budgets = {"0": gpu, "1": gpu, "cpu": int(total * (1 - share) / 2)}
                fit = plan(accel, folder, budgets, "fit")
                speed = plan(accel, folder, budgets, "speed")
                fb = fit["streamed_per_forward_pass"]["fit"]["bytes"]
                sb = speed["streamed_per_forward_pass"]["speed"]["bytes"]
                scenarios += 1
                label = f"{arch} at {int(share * 100)}%"
                if speed["streamed_per_forward_pass"]["fit"]["bytes"] != fb:
                    failures.append(f"{label}: the two runs disagree on the fit map's bytes")
                if sb > fb:
                    failures.append(f"{label}: speed streams {sb} bytes, more than fit's {fb}")
                scenario = {"dtype": "bfloat16", "max_memory": {k: v for k, v in budgets.items()}}
                for over in over_budget(tensors, speed["device_map"], scenario, fp32[arch], lambda n: renamed.get(n, n)):
                    failures.append(f"{label}: the speed map is over budget on {over}")
                if sb == 0 and fb > 0:
                    nothing += 1  # a spill scenario (the fit map streams) where the speed map streams nothing
                ratio = fb / sb if sb else float("inf")
                if fb:
                    ratios.append(ratio)
                rows += 1
                print(f"{arch:42} {int(share * 100):>4}% {fb / 2**30:>9.2f}Gi {sb / 2**30:>9.2f}Gi "
                      f"{'inf' if sb == 0 else f'{ratio:.3f}':>9}")
    finite = [r for r in ratios]
    print(f"\nscenarios: {scenarios} ({scenarios // len(GPU_SHARES)} architectures x {len(GPU_SHARES)} budgets), "
          f"{len(ratios)} where fit streams anything")
    print(f"fit/speed bytes per pass (nothing streamed counts as infinite): median {quantile(finite, 0.5):.3f}x, "
          f"p75 {quantile(finite, 0.75):.3f}x, p90 {quantile(finite, 0.9):.3f}x")
    print(f"speed streams nothing in {nothing} of the {len(ratios)} spill scenarios; speed streams less than fit in "
          f"{sum(r > 1 for r in ratios)} of {len(ratios)}")
    for f in failures:
        print("FAIL " + f)
    print("checks: speed never streams more than fit, and no speed map is over a budget: " + ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
