#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes an architecture catalog for model classes accel's built-in catalog lacks (a class of a
newer transformers, or one the built-in catalog skips), for `accel plan --catalog FILE`.

Run it with the Python that has your transformers (and torch) installed:

  python3 gen_user_catalog.py MyModelForCausalLM -o my_catalog.json
  python3 gen_user_catalog.py ClassA ClassB -o my_catalog.json --append
  python3 gen_user_catalog.py T5ForConditionalGeneration --override num_decoder_layers=4 -o t5.json

Each class is built on the meta device from its config class's defaults (no weights are read or
downloaded) and described the way the built-in catalog is (tests/compat/gen_catalog.py, which
this script imports: keep the two files together): modules in construction order, layer counts
and buffer shapes as expressions over config.json checked against the model, tied parameters,
no-split and float32 modules, checkpoint conversions, and the config defaults the expressions
use. The file is a format-2 catalog whose entries are all written in full (no "base").

Options:
  -o FILE            the catalog to write (required)
  --append           keep FILE's other entries (an entry of the same class is replaced)
  --override K=V     a config value for the build (V is JSON: 4, 1e-5, "silu", true); use it
                     when two counts share a default value and each should find its own key.
                     The catalog's defaults stay the config class's own.

A class that cannot be built is reported with the reason (exit status 1); the others are still
written.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_catalog  # noqa: E402


def parse_override(text):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--override {text!r}: write KEY=VALUE, e.g. num_decoder_layers=4")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare word: a string


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("classes", nargs="+", help="transformers model class names, e.g. LlamaForCausalLM")
    ap.add_argument("-o", "--output", required=True, help="catalog file to write")
    ap.add_argument("--append", action="store_true", help="keep the file's other entries")
    ap.add_argument("--override", action="append", type=parse_override, default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731

    entries, skipped = {}, {}
    if args.append and os.path.exists(args.output):
        with open(args.output) as f:
            old = json.load(f)
        if old.get("format") != 2:
            sys.exit(f"{args.output}: not a format-2 catalog (format {old.get('format')!r}); write a new file instead")
        by_name = {e["architecture"]: e for e in old.get("architectures", [])}
        for e in by_name.values():  # an entry with a base is written out in full: this file has no base entries
            entries[e["architecture"]] = gen_catalog.compact_entry(gen_catalog.expand(e, by_name))
        skipped = {s["architecture"]: s for s in old.get("skipped", [])}

    failed = 0
    for arch in args.classes:
        if not hasattr(transformers, arch):
            reason = f"transformers {transformers.__version__} has no class {arch}"
        else:
            log(arch)
            try:
                full = gen_catalog.describe(torch, transformers, arch, "", dict(args.override), log)
                reason = None
            except Exception as e:  # noqa: BLE001  (report it and go on with the other classes)
                reason = gen_catalog.skip_reason(e)
        if reason is None:
            entry = gen_catalog.compact_entry(full)
            assert gen_catalog.expand(entry, {}) == gen_catalog.normalized(full)
            entries[arch] = entry
            skipped.pop(arch, None)
        else:
            log(f"{arch}: cannot be catalogued: {reason}")
            failed += 1
            entries.pop(arch, None)
            skipped[arch] = {"architecture": arch, "reason": reason}

    catalog = gen_catalog.catalog_document(transformers.__version__, torch.__version__.split("+")[0], {},
                                           list(entries.values()), list(skipped.values()))
    catalog["generator"] = "tests/compat/gen_user_catalog.py"
    with open(args.output, "w") as f:
        f.write(json.dumps(catalog, indent=1) + "\n")
    log(f"wrote {args.output}: {len(entries)} entries, {len(skipped)} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
