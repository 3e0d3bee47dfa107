#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Records, for every class the catalog holds, the device maps transformers' from_pretrained
computes for it at its config class's defaults (the size the catalog was generated at), as one
compact fixture accel's planner is compared with in CI, without Python
(tests/model/catalog_goldens_check.cpp).

Each class is built on the meta device exactly as gen_catalog.py builds it (same overrides, same
repairs of defaults that do not build), in a worker process with a time limit. Its checkpoint is
what save_pretrained writes (tied copies left out, transformers' renames and expert fusions
reverted: the names users download), as a headers-only safetensors folder next to the
config.json save_pretrained writes; from_pretrained(folder, device_map=mode, max_memory=...,
dtype=...) then runs for real until the device map is computed (taken from transformers'
_get_device_map; the load stops there, before any weight would be read) for each of SCENARIOS,
whose budgets spill past the GPUs to the CPU and the disk.

The fixture, tests/compat/fixtures/catalog_goldens.json, holds per class: the config.json
(shared between classes whose config.json is the same but for "architectures"), the checkpoint's
tensors (name, shape; floating tensors take each scenario's checkpoint dtype, others keep their
own), the model's state-dict keys (what a map must cover; as the keys beyond the checkpoint's
names and the checkpoint's names beyond the keys), the other names a map may give
(modules that hold no state-dict key, buffers outside the state dict), and per scenario the
budgets (bytes) and transformers' map (model names), or the error from_pretrained raised computing
it (transformers' own failure: the check then asks only that accel's map be one from_pretrained
would accept). Names are folded: every
numbered part becomes `#`, and names that share a template and a value (a shape, a device) are
one row with the numbers as ranges per numbered part:

    ["model.layers.#.mlp.down_proj.weight", [4096, 11008], ["0-31"]]
    ["model.layers.#", 0, ["0-9"]],  ["model.layers.#", "cpu", ["10-21,23"]]

A row with several range lists stands for the union of their products. Every folded list is
unfolded again and compared with the original before anything is written.

  gen_catalog_goldens.py                  regenerate the fixture (needs torch + transformers + accelerate)
  gen_catalog_goldens.py --only A,B       record some classes and print them (writes nothing)
  gen_catalog_goldens.py --cache FILE     keep each class's result in FILE (JSON lines) and reuse it
"""
import argparse
import collections
import hashlib
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_catalog  # noqa: E402
from gen_golden_maps import SIZES, record_map, write_checkpoint_files  # noqa: E402
from gen_names import saved_state  # noqa: E402

OUT = os.path.join(HERE, "fixtures", "catalog_goldens.json")

# (name, mode, budgets as fractions of the checkpoint's size at the load dtype, dtype argument,
# checkpoint dtype of floating tensors). Both spill past every GPU to the CPU and the disk.
SCENARIOS = [
    ("auto_two_gpus_cpu_disk_bf16", "auto", {0: 0.3, 1: 0.3, "cpu": 0.25}, "bfloat16", "BF16"),
    ("sequential_gpu_cpu_disk_fp16_from_fp32", "sequential", {0: 0.45, "cpu": 0.3}, "float16", "F32"),
]
NON_FLOAT = {"torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
             "torch.uint8": "U8", "torch.bool": "BOOL"}
LOAD = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


# ---------------------------------------------------------------------------------------------
# Folding names: numbered parts as ranges.

def _ranges(numbers):
    """Sorted distinct ints as "0-31,40,42-43"."""
    out, numbers = [], sorted(numbers)
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(out)


def _unranges(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def _cover(tuples):
    """Range lists (one per position) whose products' union is exactly the set `tuples`."""
    if not next(iter(tuples)):
        return [[]]
    tails = collections.defaultdict(set)
    for t in tuples:
        tails[t[0]].add(t[1:])
    firsts = collections.defaultdict(list)
    for first, tail in tails.items():
        firsts[frozenset(tail)].append(first)
    out = []
    for tail, group in firsts.items():
        out.extend([_ranges(group)] + rest for rest in _cover(tail))
    return out


def _template(name):
    parts = name.split(".")
    numbers = tuple(int(p) for p in parts if p.isdigit())
    return ".".join("#" if p.isdigit() else p for p in parts), numbers


def fold(pairs):
    """[(name, value)] -> rows [template, value, ranges...] (value None: rows [template] / [template,
    None, ranges...]), in the order each (template, value) first occurs."""
    groups = collections.OrderedDict()
    for name, value in pairs:
        if "#" in name:
            raise ValueError(f"a name with '#' cannot be folded: {name}")
        t, numbers = _template(name)
        key = (t, json.dumps(value))
        groups.setdefault(key, (t, value, set()))[2].add(numbers)
    rows = []
    for t, value, numbers in groups.values():
        row = [t] if value is None and "#" not in t else [t, value]
        if "#" in t:
            row.extend(_cover(numbers))
        rows.append(row)
    return rows


def unfold(rows):
    """The inverse of fold, as a set of (name, value) with value JSON-encoded."""
    out = set()
    for row in rows:
        t, value = row[0], row[1] if len(row) > 1 else None
        if "#" not in t:
            out.add((t, json.dumps(value)))
            continue
        for ranges in row[2:]:
            for numbers in _product([_unranges(r) for r in ranges]):
                it = iter(numbers)
                out.add((".".join(str(next(it)) if p == "#" else p for p in t.split(".")), json.dumps(value)))
    return out


def _product(lists):
    if not lists:
        yield ()
        return
    for first in lists[0]:
        for rest in _product(lists[1:]):
            yield (first,) + rest


def folded(pairs):
    rows = fold(pairs)
    if unfold(rows) != {(n, json.dumps(v)) for n, v in pairs} or len(set(n for n, _ in pairs)) != len(pairs):
        raise AssertionError("folding lost or added names")
    return rows


# ---------------------------------------------------------------------------------------------
# One class, in a worker.

def record(torch, transformers, arch, covers, overrides, log, slow_build_s=None):
    """The golden record of one class: config.json, tensors, model keys and one map per scenario."""
    _, cfg, model, _ = gen_catalog.build_default(torch, transformers, arch, overrides, log)
    cfg.architectures = [arch]
    tensors = [(n, list(t.shape), NON_FLOAT.get(str(t.dtype))) for n, t in saved_state(model).items()]
    state = list(model.state_dict().keys())
    # Other names a map key may give: modules that hold no state-dict key (rotary embeddings) and
    # buffers outside the state dict (non-persistent ones: dispatch places them by name too).
    prefixes = {".".join(k.split(".")[:i]) for k in state for i in range(1, k.count(".") + 1)}
    known = set(state) | prefixes
    other = [n for n, _ in model.named_modules() if n and n not in known]
    other += [n for n, _ in model.named_buffers() if n not in known]
    del model
    out = {"config": json.loads(cfg.to_json_string()),
           "tensors": folded([(n, s if d is None else [s, d]) for n, s, d in tensors]),
           "model_parameters": folded([(k, None) for k in state]),
           "model_other_names": folded([(k, None) for k in other]),
           "maps": []}
    for name, mode, fractions, dtype, stored in SCENARIOS:
        files = [(n, d or stored, s) for n, s, d in tensors]
        load = LOAD.get(dtype, stored)
        total = 0
        for n, d, s in files:
            size = SIZES[load if d == stored else d]
            for x in s:
                size *= x
            total += size
        budgets = {k: int(total * f) for k, f in fractions.items()}
        scenario = {"name": name, "max_memory": {str(k): v for k, v in budgets.items()}}
        with tempfile.TemporaryDirectory() as folder:
            cfg.save_pretrained(folder)
            write_checkpoint_files(folder, files)
            try:
                scenario["result"] = folded(list(record_map(transformers, arch, folder, mode, budgets, dtype).items()))
            except Exception as error:  # noqa: BLE001  (transformers' own planning fails: recorded, accel's map is still checked)
                scenario["transformers_error"] = gen_catalog.skip_reason(error)
                log(f"    {name}: from_pretrained fails: {scenario['transformers_error']}")
        out["maps"].append(scenario)
    return out


# ---------------------------------------------------------------------------------------------

def document(results, classes, versions):
    """The fixture: shared configs, one record per class (failures listed with the reason)."""
    configs, records, failed = {}, [], []
    for arch in classes:
        r = results[arch]
        if "entry" not in r:
            failed.append({"architecture": arch, "reason": r["reason"]})
            continue
        entry = dict(r["entry"])
        # The state-dict keys as a difference from the checkpoint's names (the same for most classes).
        tensors = {n for n, _ in unfold(entry["tensors"])}
        keys = {n for n, _ in unfold(entry.pop("model_parameters"))}
        entry["state_dict_beyond_checkpoint"] = folded([(k, None) for k in sorted(keys - tensors)])
        entry["checkpoint_beyond_state_dict"] = folded([(k, None) for k in sorted(tensors - keys)])
        config = {k: v for k, v in entry.pop("config").items() if k != "architectures"}
        text = json.dumps(config, sort_keys=True)
        key = hashlib.sha256(text.encode()).hexdigest()[:12]
        configs.setdefault(key, config)
        records.append(dict(architecture=arch, config=key, **entry))
    return dict(versions, generator="tests/compat/gen_catalog_goldens.py",
                how="from_pretrained(folder, device_map=mode, max_memory=max_memory, dtype=dtype) on a headers-only "
                    "save_pretrained folder at the config class's defaults; the map taken from transformers' "
                    "_get_device_map before any weight is read",
                scenarios=[{"name": n, "device_map": m, "dtype": d, "checkpoint_dtype": c,
                            "fractions": {str(k): v for k, v in f.items()}} for n, m, f, d, c in SCENARIOS],
                configs=configs, classes=records, failed=failed)


def dumps(doc):
    """One line per class, row or config: diffs stay readable, the file stays small."""
    head = {k: v for k, v in doc.items() if k not in ("configs", "classes", "failed")}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "configs": {')
    items = list(doc["configs"].items())
    lines += [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True, separators=(',', ':'))}" + ("," if i + 1 < len(items) else "")
              for i, (k, v) in enumerate(items)]
    lines.append(" },")
    lines.append(' "classes": [')
    for i, c in enumerate(doc["classes"]):
        lines.append("  " + json.dumps(c, separators=(",", ":")) + ("," if i + 1 < len(doc["classes"]) else ""))
    lines.append(" ],")
    lines.append(' "failed": ' + json.dumps(doc["failed"]))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated classes to record and print (writes nothing)")
    ap.add_argument("--cache", help="JSON-lines file of per-class results, reused and extended")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    ap.add_argument("--timeout", type=float, default=gen_catalog.TIMEOUT_S, help="seconds one class may take")
    args = ap.parse_args()

    import accelerate
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    import transformers.modeling_utils  # noqa: F401  (imported once, before the workers fork)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    started = time.monotonic()
    with open(gen_catalog.JSON_PATH) as f:
        catalog = json.load(f)
    classes = sorted(a["architecture"] for a in catalog["architectures"])
    if args.only is not None:
        classes = [c.strip() for c in args.only.split(",") if c.strip()]
    results = gen_catalog.run_cached(classes, args.jobs, args.timeout, None, args.cache if args.only is None else None, log,
                                     work=record, verb="record", failed="failed")
    versions = {"transformers": transformers.__version__, "accelerate": accelerate.__version__,
                "torch": torch.__version__.split("+")[0]}
    doc = document(results, classes, versions)
    if args.only is not None:
        print(dumps(doc))
        return
    with open(OUT, "w") as f:
        f.write(dumps(doc))
    log(f"{len(doc['classes'])} classes recorded, {len(doc['failed'])} failed; {os.path.getsize(OUT)} bytes; "
        f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
