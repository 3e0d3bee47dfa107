#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Plans every golden-map scenario with `accel plan --json` (from the fixture's headers-only
checkpoint in Hub names and config.json, with accel's defaults: the model's names, the catalog's
no-split classes, dtype as given or `auto`) and compares, tensor by tensor, where each checkpoint
tensor lands (under its model name) with where transformers put it. Also checks what
from_pretrained checks (every model parameter has a device; no key names nothing), and that the
same plan written with `--names checkpoint` puts every checkpoint tensor in the same place. Fails on any scenario that is not parameter-identical unless KNOWN_DIFFERENCES
lists it with the reason (each is documented in tests/compat/README.md), and on a listed scenario
that now agrees (so the list never goes stale).

  compare_golden_maps.py ACCEL_BINARY [FIXTURE_DIR...]   (default: golden_maps and golden_maps_published)
  compare_golden_maps.py --fallback ACCEL_BINARY [...]   the same scenarios planned with --no-catalog (each
        architecture's entry withheld: accel's heuristics for an architecture it does not know); reports how
        many maps are placed exactly, and fails only on a map over budget (for accel's own load, which
        without the entry keeps no module in float32; transformers' load of it is reported in notes) or
        refused by from_pretrained
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_golden_maps import read_fixture, write_checkpoint_files  # noqa: E402  (pure Python; needs no torch)


# (architecture, scenario) -> why accel's map differs from transformers' on purpose.
KNOWN_DIFFERENCES = {
    # T5 keeps its feed-forward output projections (`wo`) in float32 when loaded in float16
    # (_keep_in_fp32_modules). transformers 5.25 sizes the map before it applies that, so it counts
    # them at 2 bytes: in two_gpus_auto_fp16 its map puts 427904 loaded bytes on GPU 1 (budget
    # 375321); in gpu_cpu_disk_sequential the fill boundaries move. accel sizes them at the dtype
    # they are loaded in and stays in budget.
    ("T5ForConditionalGeneration", "two_gpus_auto_fp16"): "keep-in-fp32 `wo` sized at float32 (transformers: float16)",
    ("T5ForConditionalGeneration", "gpu_cpu_disk_sequential"): "keep-in-fp32 `wo` sized at float32 (transformers: float16)",
}


def device_of(name, device_map):
    """The device of a tensor under an HF device map (longest matching key wins): the name itself,
    then each shorter dotted prefix, then the root key ""."""
    key = name
    while True:
        if key in device_map:
            return device_map[key]
        if not key:
            return None
        cut = key.rfind(".")
        key = key[:cut] if cut >= 0 else ""


CATALOG = os.path.join(os.path.dirname(os.path.dirname(HERE)), "include/accel/model/data/catalog.json")
BYTES = {"F32": 4, "F16": 2, "BF16": 2}
TORCH = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def coverage_errors(device_map, model_parameters, bare_modules):
    """What from_pretrained(device_map=...) checks (accelerate's check_device_map): every key of
    the model's state dict has a device; and what it warns about: keys naming no module or tensor."""
    uncovered = [p for p in model_parameters if device_of(p, device_map) is None]
    names = set(model_parameters) | set(bare_modules)
    for p in model_parameters:
        parts = p.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    unknown = [k for k in device_map if k != "" and k not in names]
    out = []
    if uncovered:
        out.append(f"{len(uncovered)} model parameters have no device, e.g. {uncovered[:3]}")
    if unknown:
        out.append(f"{len(unknown)} keys name nothing in the model, e.g. {unknown[:3]}")
    return out


def keep_in_fp32_by_architecture():
    """Each catalogued class's (keep_in_fp32_modules, keep_in_fp32_modules_strict), as over_budget takes them."""
    with open(CATALOG) as f:
        entries = {a["architecture"]: a for a in json.load(f)["architectures"]}

    def inherited(a, key):  # format 2: a head leaves out what it shares with its base
        return a[key] if key in a else inherited(entries[a["base"]], key) if "base" in a else []
    return {name: (inherited(a, "keep_in_fp32_modules"), inherited(a, "keep_in_fp32_modules_strict")) for name, a in entries.items()}


def over_budget(tensors, device_map, scenario, keep_in_fp32, model_name):
    """Devices whose checkpoint tensors, at the dtype they are loaded in, exceed the budget."""
    load = TORCH.get(scenario["dtype"])
    keep = []
    if load == "F16" or (load is None and tensors and tensors[0][1] == "F16"):
        keep = keep_in_fp32[0] + keep_in_fp32[1]
    elif load == "BF16" or (load is None and tensors and tensors[0][1] == "BF16"):
        keep = keep_in_fp32[1]
    used = {}
    for name, dtype, shape in tensors:
        size = 4 if any(re.search(k.replace("*", ".*"), name) for k in keep) else BYTES[load or dtype]
        for d in shape:
            size *= d
        where = str(device_of(model_name(name), device_map))
        used[where] = used.get(where, 0) + size
    return [f"{d}: {b} bytes > budget {scenario['max_memory'][d]}" for d, b in used.items()
            if d in scenario["max_memory"] and b > scenario["max_memory"][d]]


def main():
    args = sys.argv[1:]
    fallback = bool(args) and args[0] == "--fallback"
    if fallback:
        args = args[1:]
    accel = args[0]
    folders = args[1:] or [os.path.join(HERE, "fixtures", d) for d in ("golden_maps", "golden_maps_published")]
    fp32 = keep_in_fp32_by_architecture()
    agree_all = total_all = maps_equal = maps = 0
    failures = []
    for folder, file in [(d, f) for d in folders for f in sorted(os.listdir(d))]:
        fixture = read_fixture(os.path.join(folder, file))
        arch = fixture["architecture"]
        label = arch if folder.endswith("golden_maps") else f"{arch} ({os.path.basename(folder)})"
        renamed = fixture.get("renamed", {})

        def model_name(n):
            return renamed.get(n, n)

        for number, scenario in enumerate(fixture["maps"]):
            tensors = [(n, scenario["checkpoint_dtype"], shape) for n, shape in fixture["tensors"]]
            with tempfile.TemporaryDirectory() as ckpt:
                with open(os.path.join(ckpt, "config.json"), "w") as f:
                    json.dump(fixture["config"], f)
                write_checkpoint_files(ckpt, [tuple(t) for t in tensors])
                cmd = [accel, "plan", "--checkpoint", ckpt, "--json", "--device-map", scenario["device_map"],
                       "--max-memory", json.dumps(scenario["max_memory"])]
                if scenario["dtype"] != "auto":
                    cmd += ["--dtype", scenario["dtype"]]
                if fallback:
                    cmd += ["--no-catalog"]
                run = subprocess.run(cmd, capture_output=True, text=True)
                # Once per fixture: the same plan in checkpoint names puts every checkpoint tensor
                # where the model-name map puts the model tensor it makes.
                by_checkpoint = subprocess.run(cmd + ["--names", "checkpoint"], capture_output=True, text=True) \
                    if number == 0 and run.returncode == 0 and not fallback else None
            if run.returncode != 0:
                print(f"{label} {scenario['name']}: accel plan failed ({run.returncode}): {run.stderr.strip()}")
                return 1
            ours, theirs = json.loads(run.stdout), scenario["result"]
            agree = sum(device_of(model_name(n), ours) == device_of(model_name(n), theirs) for n, _, _ in tensors)
            for error in coverage_errors(ours, fixture["model_parameters"], fixture["model_bare_modules"]):
                failures.append(f"{label} {scenario['name']}: from_pretrained would refuse accel's map: {error}")
            if by_checkpoint is not None:
                if by_checkpoint.returncode != 0:
                    failures.append(f"{label}: accel plan --names checkpoint failed: {by_checkpoint.stderr.strip()}")
                else:
                    in_checkpoint = json.loads(by_checkpoint.stdout)
                    moved = [n for n, _, _ in tensors if device_of(n, in_checkpoint) != device_of(model_name(n), ours)]
                    if moved:
                        failures.append(f"{label}: {len(moved)} tensors land elsewhere under the checkpoint-name map, "
                                        f"e.g. {moved[:3]}")
            agree_all += agree
            total_all += len(tensors)
            maps += 1
            maps_equal += agree == len(tensors)
            known = KNOWN_DIFFERENCES.get((arch, scenario["name"]))
            note = f" (known difference: {known})" if known and agree != len(tensors) else ""
            print(f"{label} {scenario['name']}: {agree}/{len(tensors)} tensors agree{note}")
            if agree != len(tensors) and not known and not fallback:
                differ = [n for n, _, _ in tensors if device_of(model_name(n), ours) != device_of(model_name(n), theirs)]
                failures.append(f"{label} {scenario['name']}: {len(differ)} tensors differ, e.g. {differ[:3]}")
            # Withheld, the entry's keep-in-fp32 modules are unknown too: accel's own load of its
            # map keeps none (the budget check), transformers' keeps the class's (reported apart).
            for over in over_budget(tensors, ours, scenario, ([], []) if fallback else fp32[arch], model_name):
                failures.append(f"{label} {scenario['name']}: accel's map is over budget at the loaded dtype on {over}")
            if fallback:
                for over in over_budget(tensors, ours, scenario, fp32[arch], model_name):
                    print(f"note: {label} {scenario['name']}: loaded by transformers, which keeps the class's keep-in-fp32 "
                          f"modules in float32, this map would be over budget on {over}")
            if agree == len(tensors) and known and not fallback:
                failures.append(f"{label} {scenario['name']}: now agrees; remove it from KNOWN_DIFFERENCES and tests/compat/README.md")
    what = "golden maps, catalog withheld (--no-catalog)" if fallback else "golden maps"
    print(f"{what}: {maps_equal}/{maps} maps agree on every tensor; {agree_all}/{total_all} tensors agree")
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
