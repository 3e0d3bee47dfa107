#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Differential test of `accel plan --like transformers` against transformers' own planning code on
random model trees, without torch: the functions transformers' from_pretrained(device_map=...)
plans with (integrations/accelerate.py: get_balanced_memory, infer_auto_device_map and helpers;
accelerate's get_max_layer_size and clean_device_map) are read from the installed or unpacked
sources and run over small stand-ins for torch modules and parameters.

  diff_transformers_planner.py ACCEL TRANSFORMERS_DIR ACCELERATE_DIR [--trees N] [--seed S]

TRANSFORMERS_DIR / ACCELERATE_DIR: the package folders (e.g. site-packages/transformers). Prints
each disagreement (tree, budgets, both maps) and a summary; exits 1 when any map differs.

Trees: nested modules with float32 parameters, some `Block` modules (the no-split class), tied
copies registered after their source (transformers excludes the copies from sizes, accel counts a
tied tensor under its first name: the same bytes), buffers only in modules without children
(transformers drops a split module's own buffers, accel keeps them: a documented difference).
"""
import argparse
import ast
import collections
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_golden_maps import device_of  # noqa: E402  (one rule for "where does this tensor go")


# --- stand-ins for the few torch pieces the planning functions touch -------------------------
class Tensor:
    def __init__(self, numel, itemsize=4):
        self._numel, self._itemsize = numel, itemsize

    def numel(self):
        return self._numel

    def element_size(self):
        return self._itemsize


class Parameter(Tensor):
    pass


class Module:
    def __init__(self):
        self._parameters, self._buffers, self._modules = {}, {}, {}

    def named_children(self):
        return list(self._modules.items())

    def named_parameters(self, prefix="", recurse=True):
        out = [(prefix + n, p) for n, p in self._parameters.items()]
        if recurse:
            for cn, c in self._modules.items():
                out += c.named_parameters(prefix + cn + ".", True)
        return out

    def named_buffers(self, prefix="", recurse=True):
        out = [(prefix + n, b) for n, b in self._buffers.items()]
        if recurse:
            for cn, c in self._modules.items():
                out += c.named_buffers(prefix + cn + ".", True)
        return out

    def named_modules(self, prefix=""):
        out = [(prefix, self)]
        for cn, c in self._modules.items():
            out += c.named_modules(prefix + ("." if prefix else "") + cn)
        return out


class _NN:
    Module = Module
    Parameter = Parameter


class _Torch:
    nn = _NN
    Tensor = Tensor


class _Logger:
    def __getattr__(self, _):
        return lambda *a, **k: None


def load_functions(path, names, namespace):
    """Executes the named top-level functions of a source file in `namespace`."""
    with open(path) as f:
        tree = ast.parse(f.read())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    for n in body:
        n.decorator_list = []
        n.returns = None
        for a in n.args.args + n.args.kwonlyargs:
            a.annotation = None
    missing = set(names) - {n.name for n in body}
    if missing:
        sys.exit(f"{path} lacks {sorted(missing)}")
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)


def get_max_memory(max_memory=None):
    """accelerate's get_max_memory for an explicit dict: GPUs sorted, then cpu, then disk."""
    gpus = sorted(k for k in max_memory if isinstance(k, int))
    return {k: max_memory[k] for k in gpus + [k for k in ("cpu", "disk") if k in max_memory]}


def transformers_planner(tf_dir, acc_dir):
    ns = {"torch": _Torch, "nn": _NN, "logger": _Logger(), "OrderedDict": collections.OrderedDict,
          "defaultdict": collections.defaultdict, "copy": copy, "get_max_memory": get_max_memory,
          "accelerate_max_memory": get_max_memory}
    load_functions(os.path.join(acc_dir, "utils", "modeling.py"), ["get_max_layer_size", "clean_device_map"], ns)
    load_functions(os.path.join(tf_dir, "integrations", "accelerate.py"),
                   ["get_module_size_with_ties", "compute_module_sizes", "compute_module_total_buffer_size",
                    "get_balanced_memory", "_init_infer_auto_device_map", "infer_auto_device_map",
                    "_get_param_device", "check_tied_parameters_on_same_device"], ns)
    ns["get_max_memory"] = get_max_memory  # transformers' own adds torch's cached memory: none here

    def plan(model, mode, max_memory, no_split):
        mm = dict(max_memory)
        if mode != "sequential":
            mm = ns["get_balanced_memory"](model, max_memory=mm, no_split_module_classes=no_split,
                                           low_zero=(mode == "balanced_low_0"))
        return ns["infer_auto_device_map"](model, max_memory=mm, no_split_module_classes=no_split)
    return plan


# --- random trees, as a torch-like model and as accel's skeleton JSON ------------------------
def random_model(rng):
    classes = {}

    def new_module(cls):
        if cls not in classes:
            classes[cls] = type(cls, (Module,), {})
        return classes[cls]()

    root = new_module("Root")
    skeleton = {"modules": [{"name": "", "class": "Root"}], "parameters": [], "buffers": [], "tied": []}
    params = []  # (full name, numel) of parameters that can be tied to
    tied_keys = {}
    counter = [0]

    def build(module, prefix, depth):
        children = rng.randint(0, 4) if depth < 3 else 0
        is_leaf = children == 0
        for _ in range(rng.randint(0 if not is_leaf else 1, 2)):
            counter[0] += 1
            local = f"w{counter[0]}"
            name = prefix + local
            if params and rng.random() < 0.15:
                # One tie group per model, as the catalog's architectures have (embeddings and
                # their copies): accel also brings partners of partners, transformers does not.
                source, numel = params[0]
                tied_keys[name] = source
                skeleton["tied"].append([source, name])
            else:
                numel = rng.randint(1, 64)
                params.append((name, numel))
            module._parameters[local] = Parameter(numel)
            skeleton["parameters"].append({"name": name, "shape": [numel], "dtype": "float32"})
        if is_leaf and rng.random() < 0.2:
            numel = rng.randint(1, 16)
            module._buffers["buf"] = Tensor(numel)
            skeleton["buffers"].append({"name": f"{prefix}buf", "shape": [numel], "dtype": "float32",
                                        "persistent": rng.random() < 0.5})
        for _ in range(children):
            cls = "Block" if depth >= 1 and rng.random() < 0.35 else f"M{depth}"
            child = new_module(cls)
            # Unique local names: transformers finds tied partners by substring (`name + "."` in a
            # tied name), which fails on trees where one module's name ends another's.
            counter[0] += 1
            local = f"{'b' if cls == 'Block' else 'c'}{counter[0]}"
            module._modules[local] = child
            skeleton["modules"].append({"name": prefix + local, "class": cls})
            build(child, prefix + local + ".", depth + 1)

    build(root, "", 0)
    # A module without tensors anywhere below it is not in transformers' maps: drop such trees.
    root.all_tied_weights_keys = tied_keys
    return root, skeleton


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("accel")
    ap.add_argument("transformers_dir")
    ap.add_argument("accelerate_dir")
    ap.add_argument("--trees", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    plan = transformers_planner(args.transformers_dir, args.accelerate_dir)
    rng = random.Random(args.seed)
    same = differ = skipped = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.trees):
            model, skeleton = random_model(rng)
            names = [p["name"] for p in skeleton["parameters"]]
            if not names:
                skipped += 1
                continue
            total = sum(p["shape"][0] * 4 for p in skeleton["parameters"] if p["name"] not in model.all_tied_weights_keys)
            mode = rng.choice(["sequential", "auto", "balanced", "balanced_low_0"])
            mm = {g: rng.randint(total // 8, total) for g in range(rng.randint(1, 3))}
            if rng.random() < 0.8:
                mm["cpu"] = rng.randint(total // 4, 2 * total)
            no_split = ["Block"] if any(m.get("class") == "Block" for m in skeleton["modules"]) else []
            try:
                theirs = plan(model, mode, mm, no_split)
            except (IndexError, ValueError, KeyError) as e:  # transformers fails on this tree
                skipped += 1
                continue
            path = os.path.join(tmp, f"t{i}.json")
            with open(path, "w") as f:
                json.dump(skeleton, f)
            cmd = [args.accel, "plan", "--skeleton", path, "--json", "--device-map", mode, "--like", "transformers",
                   "--max-memory", json.dumps({str(k): v for k, v in mm.items()})]
            cmd += ["--no-split", "Block"] if no_split else ["--no-split", "none"]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"tree {i}: accel plan failed: {run.stderr.strip()}")
                differ += 1
                continue
            ours = json.loads(run.stdout)
            bad = [n for n in names if str(device_of(n, ours)) != str(device_of(n, theirs))]
            if bad:
                differ += 1
                print(f"tree {i} ({mode}, {mm}): {len(bad)} of {len(names)} parameters differ, e.g. {bad[:3]}\n"
                      f"  skeleton {json.dumps(skeleton)}\n  accel        {json.dumps(ours)}\n  transformers {json.dumps(theirs)}")
            else:
                same += 1
    print(f"{same} maps identical, {differ} differ, {skipped} skipped (no parameters, or transformers failed)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
