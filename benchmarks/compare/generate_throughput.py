#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Tokens per second of examples/llama_generate with its prompts split between 2 replicas, or pipelined
over 2 stages, against one process and against the ceiling: two independent single-process runs
side by side, each with half of the prompts, which is what two processes would reach if splitting,
passing hidden states and gathering cost nothing.

Makes a Llama of about 150 MB (make_demo_checkpoint.py: 148.5 MiB bfloat16, 16 layers, untied
32000 x 512 embedding) in WORK, and a file of PROMPTS prompts of 8 token ids each. Each run
generates TOKENS new tokens per prompt on the CPU (--no-gpu), in three configurations:

  1 process    llama_generate --prompts all.txt
  2 replicas   accel launch --cpu --num_processes 2 llama_generate --prompts all.txt
  2 stages     accel launch --cpu --num_processes 2 llama_generate --prompts all.txt --stages 2
  2 stages, 0.55x  the same with --max-memory cpu=0.55 x the model's weight bytes per process (disk
               unbounded) and --objective speed: each process holds at most 0.55x of the weights in
               memory, the untied embedding (read by rows) left on disk
  ceiling      llama_generate --prompts first-half.txt & llama_generate --prompts second-half.txt

one after the other in each round, the order rotating between rounds, after one warm-up round
(page cache). Two rates per configuration: `generation`, the tokens over the time from the loaded
model to the gathered results, as the example prints it (for the ceiling: both runs' tokens over
the longer of the two runs' times); `end to end`, the tokens over the wall time of the whole
command (starting the processes, loading, generating). Medians over the rounds. For the stages,
also each stage's share of the model's weight bytes and its busy fraction (computing / generation
time), as the example reports them, medians over the rounds.

usage: generate_throughput.py BUILD_DIR [--work DIR] [--runs N] [--prompts N] [--tokens N]
       (BUILD_DIR has bin/accel and examples/llama_generate; build it with -DCMAKE_BUILD_TYPE=Release)
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = ["--layers", "16", "--hidden", "512", "--intermediate", "1408", "--vocab", "32000", "--heads", "8",
         "--kv-heads", "2", "--untied"]
PROMPT_TOKENS = 8
GENERATED = re.compile(r"generated (\d+) tokens? for (\d+) prompts? in ([\d.]+) s")
STAGE = re.compile(r"process (\d+) \(replica \d+, stage (\d+): ([^)]*)\): \d+ weight bytes in memory \(([\d.]+) of the model's \d+\)"
                   r"(?:, \d+ on disk)?, busy (\d+)%")


def start(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, cmd):
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out}\n{err}")
    m = GENERATED.search(out)
    if not m:
        sys.exit(f"no 'generated ... tokens' line in the output of {' '.join(cmd)}:\n{out}")
    stages = [(int(s.group(2)), s.group(3), float(s.group(4)), int(s.group(5))) for s in STAGE.finditer(out)]
    return int(m.group(1)), float(m.group(3)), [line for line in out.splitlines() if line.startswith("prompt ")], stages


def measure(commands):
    """Runs `commands` side by side: (tokens, generation seconds (the longest), wall seconds, prompt lines,
    stage reports [(stage, role, weight share, busy %)])."""
    t0 = time.monotonic()
    procs = [start(c) for c in commands]
    results = [finish(p, c) for p, c in zip(procs, commands)]
    wall = time.monotonic() - t0
    return (sum(r[0] for r in results), max(r[1] for r in results), wall, [line for r in results for line in r[2]],
            [s for r in results for s in r[3]])


def weight_bytes(checkpoint):
    """The bytes of every tensor of the checkpoint's safetensors files, from their headers."""
    total = 0
    for name in os.listdir(checkpoint):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(checkpoint, name), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def write_prompts(path, prompts):
    with open(path, "w") as f:
        f.write("# generate_throughput.py: token ids drawn from a seeded generator\n")
        for p in prompts:
            f.write(",".join(map(str, p)) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--work", default=None, help="where the checkpoint and prompts go (default BUILD_DIR/generate-bench)")
    ap.add_argument("--runs", type=int, default=3, help="rounds measured after the warm-up (at least 3)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per prompt")
    args = ap.parse_args()
    if args.runs < 3 or args.prompts < 2:
        sys.exit("give --runs >= 3 and --prompts >= 2")
    accel = os.path.join(args.build, "bin", "accel")
    generate = os.path.join(args.build, "examples", "llama_generate")
    work = args.work or os.path.join(args.build, "generate-bench")
    checkpoint = os.path.join(work, "llama-148MiB")
    if not os.path.exists(os.path.join(checkpoint, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "make_demo_checkpoint.py"), checkpoint, *MODEL], check=True,
                       stdout=subprocess.DEVNULL)
    rng = random.Random(20261205)
    prompts = [[rng.randrange(32000) for _ in range(PROMPT_TOKENS)] for _ in range(args.prompts)]
    half = args.prompts // 2
    files = {name: os.path.join(work, f"{name}.txt") for name in ("all", "first", "second")}
    write_prompts(files["all"], prompts)
    write_prompts(files["first"], prompts[:half])
    write_prompts(files["second"], prompts[half:])

    common = ["--checkpoint", checkpoint, "--new-tokens", str(args.tokens), "--no-gpu"]
    configs = {
        "1 process": [[generate, *common, "--prompts", files["all"]]],
        "2 replicas": [[accel, "launch", "--cpu", "--num_processes", "2", generate, *common, "--prompts", files["all"]]],
        "2 stages": [[accel, "launch", "--cpu", "--num_processes", "2", generate, *common, "--prompts", files["all"], "--stages", "2"]],
        "2 stages, 0.55x": [[accel, "launch", "--cpu", "--num_processes", "2", generate, *common, "--prompts", files["all"], "--stages", "2",
                             "--max-memory", f"cpu={int(0.55 * weight_bytes(checkpoint))}", "--objective", "speed"]],
        "ceiling": [[generate, *common, "--prompts", files["first"]], [generate, *common, "--prompts", files["second"]]],
    }
    names = list(configs)
    print(f"model: {checkpoint} (148.5 MiB bfloat16, 16 layers, untied 32000 x 512 embedding), on the CPU")
    print(f"{args.prompts} prompts of {PROMPT_TOKENS} tokens, {args.tokens} new tokens each; "
          f"{args.runs} rounds after a warm-up, the order rotating; {os.cpu_count()} CPUs\n")
    reference = None
    for name in names:  # warm-up round; every configuration must produce the same tokens
        lines = sorted(measure(configs[name])[3])
        if reference is None:
            reference = lines
        elif lines != reference:
            sys.exit(f"{name} produced other tokens than {names[0]}:\n" + "\n".join(lines))
    samples = {name: [] for name in names}
    stage_samples = {}
    for r in range(args.runs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            tokens, gen_s, wall_s, _, stages = measure(configs[name])
            samples[name].append((tokens / gen_s, tokens / wall_s))
            for stage, role, share, busy in stages:
                stage_samples.setdefault((name, stage, role, share), []).append(busy)
    med = {name: (statistics.median(s[0] for s in samples[name]), statistics.median(s[1] for s in samples[name])) for name in names}
    print(f"{'configuration':<16} {'generation tok/s':>17} {'end to end tok/s':>17}   runs (generation tok/s)")
    for name in names:
        runs = ", ".join(f"{s[0]:.1f}" for s in samples[name])
        print(f"{name:<16} {med[name][0]:>17.1f} {med[name][1]:>17.1f}   {runs}")
    for i, what in enumerate(("generation", "end to end")):
        print(f"{what}: 2 replicas / ceiling {med['2 replicas'][i] / med['ceiling'][i]:.2f}x, "
              f"2 stages / ceiling {med['2 stages'][i] / med['ceiling'][i]:.2f}x, "
              f"2 stages 0.55x / ceiling {med['2 stages, 0.55x'][i] / med['ceiling'][i]:.2f}x, "
              f"2 replicas / 1 process {med['2 replicas'][i] / med['1 process'][i]:.2f}x, "
              f"2 stages / 1 process {med['2 stages'][i] / med['1 process'][i]:.2f}x, "
              f"ceiling / 1 process {med['ceiling'][i] / med['1 process'][i]:.2f}x")
    for (name, stage, role, share), busy in sorted(stage_samples.items()):
        print(f"{name}: stage {stage} ({role}) holds {share:.2f} of the weights in memory, busy median {statistics.median(busy):.0f}% "
              f"(runs: {', '.join(f'{b}%' for b in busy)})")


if __name__ == "__main__":
    main()
