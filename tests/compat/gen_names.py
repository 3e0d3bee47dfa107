#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Generates accel's name data: for every model class transformers exports, how the names a Hub
folder holds (what save_pretrained writes) become the names of the model transformers builds
(what from_pretrained(device_map=...) wants), as a few rename rules per class.

For each class: the model is built on the meta device from its config class's defaults (names
only, no weights); its state dict (without tied copies) is saved the way save_pretrained saves it
(transformers' revert_weight_conversion), and every saved name is renamed back the way
from_pretrained renames checkpoint keys (rename_source_key, with the legacy renames and the
base-model prefix rule). Each (checkpoint name, model name) pair is reduced to a rule by dropping
the dotted suffix the two share, numbered parts as `{i}`, `{j}`, ...:

    vit.encoder.layer.{i}.intermediate.dense  ->  vit.layers.{i}.mlp.fc1
    language_model.model                      ->  model.language_model
    model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight -> model.layers.{i}.mlp.experts.gate_up_proj

A checkpoint name takes the rule whose checkpoint side is its longest matching prefix; numbered
parts keep their values in order, and a numbered part the model side lacks is fused (many
checkpoint tensors make one model tensor). Where transformers' regular expressions do more, a
number inside a part is a placeholder too, and a model number may be the value plus a constant
or written out (reduce_pair_shifted):

    model.visual.layers.linear_{i}            ->  model.vision_tower.encoder_layers.{i}.projection
    model.llm.attn_res.attn_queries.{i}       ->  model.layers.{i+1}.attention_input.query
 The rules are checked, in this script, against
transformers' own answer for every key of every class; a class whose rules do not reproduce it
is recorded with `"exact": false` and the first key that differs.

Also per class: the base-model prefix, the top-level names of both sides and the names a
checkpoint holds under the prefix (for transformers' rule that adds or strips the prefix), and the tied parameters save_pretrained leaves out, for
tie_word_embeddings true and false.

Writes include/accel/model/data/names.json and its embedded copy include/accel/model/detail/names_data.hpp.

  gen_names.py               regenerate both (needs torch + transformers; ~15 min on 2 cores)
  gen_names.py --embed       rewrite only the .hpp from the committed JSON (no torch needed)
  gen_names.py --only A B    print the entries of some classes (debugging; writes nothing)
"""
import argparse
import json
import multiprocessing
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embed_json  # noqa: E402
from gen_catalog import repairs, template, tie_group_templates  # noqa: E402  (numbered parts as {i}, {j}, ...)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JSON_PATH = os.path.join(ROOT, "include/accel/model/data/names.json")
HPP_PATH = os.path.join(ROOT, "include/accel/model/detail/names_data.hpp")
LETTERS = "ijklmnopq"


def is_number(part):
    return part.isdigit()


def template_parts(name):
    """model.layers.3.mlp -> (['model', 'layers', None, 'mlp'], ['3']): None marks a numbered part."""
    parts, values = [], []
    for p in name.split("."):
        if is_number(p):
            parts.append(None)
            values.append(p)
        else:
            parts.append(p)
    return parts, values


# A template part with a numbered placeholder: `{i}` (a whole numbered part), `linear_{i}` (a
# number inside a part: transformers' `linear_(\d+)`), on the model side also `{i+1}` (the
# number plus a constant: Inkling2's `attn_queries.{i}` -> `layers.{i+1}.attention_input`).
PLACEHOLDER = re.compile(r"^([^{}]*)\{([a-z])([+-][0-9]+)?\}([^{}]*)$")


def placeholder(t):
    """(text before, offset, text after) of a template part with a placeholder, else None."""
    found = PLACEHOLDER.match(t)
    return None if found is None else (found.group(1), int(found.group(3) or 0), found.group(4))


def part_value(t, p):
    """The number a placeholder part `t` takes from the name part `p` (None: no match)."""
    before, _, after = placeholder(t)
    if len(p) <= len(before) + len(after) or not p.startswith(before) or not p.endswith(after):
        return None
    number = p[len(before):len(p) - len(after)]
    return number if is_number(number) else None


def part_matches(t, p):
    return t == p if placeholder(t) is None else part_value(t, p) is not None


def matching_rule(rules, key):
    """The rule accel applies to `key`: the longest matching checkpoint-side prefix (the earlier
    among equals), or None."""
    parts = key.split(".")
    best = None
    for c, m in rules:
        cp = c.split(".")
        if len(cp) > len(parts) or (best is not None and len(cp) <= len(best[0].split("."))):
            continue
        if all(part_matches(t, p) for t, p in zip(cp, parts)):
            best = (c, m)
    return best


def rule_matches(checkpoint_side, key):
    cp, parts = checkpoint_side.split("."), key.split(".")
    return len(cp) <= len(parts) and all(part_matches(t, p) for t, p in zip(cp, parts))


def shortest_rule(ckpt, model):
    """How many leading parts of `ckpt` the shortest rule keeps: all but the dotted suffix it
    shares with `model` (at least one part on each side)."""
    c, m = ckpt.split("."), model.split(".")
    n = 0
    while n < min(len(c), len(m)) - 1 and c[-1 - n] == m[-1 - n]:
        n += 1
    return len(c) - n


def apply_rules(rules, key):
    """What accel does (include/accel/model/names.hpp): the rule of matching_rule; its numbered
    values fill the model side in order; the rest of the name follows unchanged."""
    best = matching_rule(rules, key)
    if best is None:
        return key
    parts = key.split(".")
    cp = best[0].split(".")
    values = [part_value(t, p) for t, p in zip(cp, parts) if placeholder(t) is not None]
    out, k = [], 0
    for t in best[1].split("."):
        ph = placeholder(t)
        if ph is None:
            out.append(t)
            continue
        before, offset, after = ph
        out.append(before + (str(int(values[k]) + offset) if offset else values[k]) + after)
        k += 1
    return ".".join(out + parts[len(cp):])


def prefix_rule(key, model, n, literal=False, reduce=None):
    """The rule for the first n parts of `key` (the whole pair when `model` does not end with
    the rest of `key`), made by `reduce` (reduce_pair_exact unless given)."""
    reduce = reduce or reduce_pair_exact
    c = key.split(".")
    rest = c[n:]
    m = model.split(".")
    if n >= len(c) or not rest or m[len(m) - len(rest):] != rest or len(m) <= len(rest):
        return reduce(key, model, literal)
    return reduce(".".join(c[:n]), ".".join(m[:len(m) - len(rest)]), literal)


def reduce_pair_exact(ckpt, model, literal=False):
    """A rule for exactly these two (prefix) names, numbered parts as placeholders; with `literal`,
    the checkpoint's numbered parts the model side does not take in order stay written out."""
    c_parts, c_values = template_parts(ckpt)
    m_parts, m_values = template_parts(model)
    if literal:
        kept, k = [], 0
        for p in ckpt.split("."):
            if is_number(p) and k < len(m_values) and m_values[k] == p:
                kept.append(None)
                k += 1
            else:
                kept.append(p)
        c_parts, c_values = kept, m_values[:k]
    if len(m_values) > len(c_values) or m_values != c_values[:len(m_values)]:
        return None
    fill = lambda parts: ".".join("{" + LETTERS[k] + "}" if p is None else p  # noqa: E731
                                  for p, k in zip(parts, numbering(parts)))
    return fill(c_parts), fill(m_parts)


def reduce_pair_shifted(ckpt, model, inside=False, model_literals=False, literal=False):
    """A rule for these two (prefix) names for what reduce_pair_exact cannot express: the model's
    numbered parts take the checkpoint's numbers in order, each plus a constant when they differ
    (`attn_queries.{i}` -> `layers.{i+1}.attention_input`); with `inside`, a number inside a
    checkpoint part counts too, its last run of digits (`linear_{i}` -> `encoder_layers.{i}`,
    `conv2d{i}` -> `convs.{i-1}`); with `model_literals`, model numbers left without a checkpoint
    number are written out (`fc1` -> `mlp.layers.0`). The checkpoint's numbers the model does not
    take stay placeholders (fused), or with `literal` written out; one inside a part stays written
    out. None when the model has numbers left over and `model_literals` is not set."""
    c_parts = ckpt.split(".")
    slots = []  # (part index, text before the number, the number, text after)
    for i, p in enumerate(c_parts):
        if is_number(p):
            slots.append((i, "", p, ""))
        elif inside:
            run = re.search(r"([0-9]+)(?!.*[0-9])", p)
            if run is not None and "{" not in p and "}" not in p:
                slots.append((i, p[:run.start()], run.group(1), p[run.end():]))
    m_parts = model.split(".")
    out_c, out_m, k = list(c_parts), [], 0
    for p in m_parts:
        if not is_number(p):
            out_m.append(p)
            continue
        if k < len(slots):
            i, before, number, after = slots[k]
            offset = int(p) - int(number)
            out_c[i] = before + "{" + LETTERS[k] + "}" + after
            out_m.append("{" + LETTERS[k] + (f"{offset:+d}" if offset else "") + "}")
            k += 1
        elif model_literals:
            out_m.append(p)
        else:
            return None
    if k == 0 and not model_literals:
        return None
    letter = k
    for i, before, number, after in slots[k:]:
        if before or after or literal:
            continue
        out_c[i] = "{" + LETTERS[letter] + "}"
        letter += 1
    return ".".join(out_c), ".".join(out_m)


def numbering(parts):
    out, k = [], 0
    for p in parts:
        out.append(k)
        if p is None:
            k += 1
    return out


def adjust_prefix(key, prefix, checkpoint_roots, model_roots, base_roots):
    """transformers' base-model prefix rule as accel applies it, before the renames: a key of a
    base-model checkpoint (its first part one of `base_roots`, the names a head model's checkpoint
    holds under the prefix) gets the prefix, and a head model's key loaded into the base model
    loses it; a key that starts with a top-level name of either side is left alone."""
    if not prefix:
        return key
    head, _, rest = key.partition(".")
    if head in checkpoint_roots or head in model_roots:
        return key
    if prefix in checkpoint_roots and head in base_roots:
        return prefix + "." + key
    if head == prefix and rest and (rest.split(".", 1)[0] in checkpoint_roots or rest.split(".", 1)[0] in model_roots):
        return rest
    return key


def saved_state(model):
    """The state dict as save_pretrained writes it (a Hub folder): without tied copies, with
    transformers' load-time renames and expert fusions reverted."""
    from transformers.core_model_loading import revert_weight_conversion
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    return revert_weight_conversion(model, {k: v for k, v in model.state_dict().items() if k not in tied})


def loading_renamer(model):
    """checkpoint name -> model name, as from_pretrained renames a checkpoint's keys for `model`
    (its conversion mapping, then the base-model prefix rule)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    state = model.state_dict()
    conversions = get_model_conversion_mapping(model, None, None)
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    prefix = model.base_model_prefix

    def model_name(key):
        renamed, _ = rename_source_key(key, renamings, converters, prefix, state)
        if renamed not in state and key in state:
            renamed, _ = rename_source_key(key, [], [], prefix, state)
        return renamed

    return model_name


def describe(arch):
    """The entry of one class, or {"class": arch, "error": why}."""
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    cls = getattr(transformers, arch)

    fix = {}

    def build(**changes):
        config = cls.config_class(**dict(fix, **changes))
        with torch.device("meta"):
            return cls(config)

    try:
        model = build()
    except Exception as e:  # noqa: BLE001  (a config class that needs arguments, a missing optional package)
        # Defaults the model cannot use (head_dim left None) are repaired as gen_catalog.py repairs
        # them, so the classes it catalogues have their names here too.
        model = None
        try:
            fix = repairs(cls.config_class())
            model = build() if fix else None
        except Exception:  # noqa: BLE001
            pass
        if model is None:
            return {"class": arch, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    state = model.state_dict()
    try:
        saved = list(saved_state(model))
    except Exception as e:  # noqa: BLE001
        return {"class": arch, "error": f"save_pretrained's renaming fails: {type(e).__name__}: {str(e)[:160]}"}
    model_name = loading_renamer(model)
    prefix = model.base_model_prefix or ""

    pairs = [(k, model_name(k)) for k in saved]
    checkpoint_roots = sorted({k.split(".", 1)[0] for k in saved})
    model_roots = sorted({k.split(".", 1)[0] for k in state})
    base_roots = sorted({k.split(".")[1] for k in saved if prefix and k.startswith(prefix + ".") and k.count(".") >= 1})
    rules = []
    exact, first_difference = True, None
    # One representative per pair of templates (`mlp.0` -> `fc1` and `mlp.2` -> `fc2` are two);
    # rules are chosen against these and checked against every key below.
    adjusted = [(adjust_prefix(c, prefix, checkpoint_roots, model_roots, base_roots), m) for c, m in pairs]
    reps = {}
    for c, m in adjusted:
        reps.setdefault((template(c), template(m)), (c, m))
    # A folder already in the model's names must come out unchanged too (`model.visual.…` of
    # Qwen2-VL is not caught by `model` -> `model.language_model`), except where a model name is
    # also a checkpoint name that transformers renames.
    renamed_from = {c for c, m in adjusted if c != m}
    keep = [(k, k) for k in state if k not in renamed_from and adjust_prefix(k, prefix, checkpoint_roots, model_roots, base_roots) == k]
    for k, _ in keep:
        reps.setdefault((template(k), template(k)), (k, k))
    # Every pair of the representative's templates: a rule must rename all of them (the same
    # templates with other numbers), which a rule adding a constant to a number must be checked on.
    alike = {}
    for c, m in adjusted + keep:
        alike.setdefault((template(c), template(m)), []).append((c, m))
    reps = sorted(reps.values())
    # Each renamed name gets the shortest rule (the most shared suffix dropped) that renames every
    # representative it would catch as transformers does: `model.layers.{i}` -> `model.layers.{i}.mlp`
    # would also catch the layer norms, so `model.layers.{i}.post_mlp_layernorm` it is.
    # Numbered parts as placeholders first (they match every block, and fuse experts), then with
    # the numbers the model side does not keep written out (`merger.mlp.2` -> `linear_fc2`); then
    # what transformers' regular expressions do beyond that (reduce_pair_shifted): numbers plus a
    # constant, numbers inside a part, and model numbers no checkpoint number gives written out.
    ways = [(literal, None) for literal in (False, True)]
    for inside, model_literals in ((False, False), (True, False), (False, True), (True, True)):
        shifted = lambda a, b, literal, i=inside, ml=model_literals: reduce_pair_shifted(a, b, i, ml, literal)  # noqa: E731
        ways += [(literal, shifted) for literal in (False, True)]
    for c, m in reps:
        if apply_rules(rules, c) == m:
            continue
        chosen = None
        group = alike[(template(c), template(m))]
        # The rule is read from the representative, else from the last of its templates' pairs,
        # whose numbers tell apart what the first's may not (RF-DETR's `backbone.0....layer.0`).
        for c1, m1 in [(c, m)] + ([group[-1]] if group[-1] != (c, m) else []):
            for literal, reduce in ways:
                for n in range(shortest_rule(c1, m1), len(c1.split(".")) + 1):
                    rule = prefix_rule(c1, m1, n, literal, reduce)
                    if rule is None:
                        continue
                    trial = rules + [list(rule)]
                    if all(apply_rules(trial, c2) == m2 for c2, m2 in reps if rule_matches(rule[0], c2)) and \
                            all(apply_rules(trial, c2) == m2 for c2, m2 in group):
                        chosen = rule
                        break
                if chosen is not None:
                    break
            if chosen is not None:
                break
        if chosen is None:
            # The other names still get their rules; the class is marked inexact.
            if exact:
                exact, first_difference = False, f"{c} -> {m}: no rule renames it without renaming others wrongly"
            continue
        rules.append(list(chosen))
    rules.sort(key=lambda r: (-len(r[0].split(".")), r[0]))
    if exact:
        for c, m in adjusted + keep:
            got = apply_rules(rules, c)
            if got != m:
                exact, first_difference = False, f"{c} -> {m}, rules give {got}"
                break
    unknown = [m for _, m in pairs if m not in state]
    if unknown:
        exact, first_difference = False, f"transformers renames {unknown[0]!r} to no model key"

    def tie_groups(tie):
        if tie is None:
            m = model
        else:
            try:
                m = build(tie_word_embeddings=tie)
            except Exception:  # noqa: BLE001
                return None
        groups = tie_group_templates(dict(getattr(m, "all_tied_weights_keys", {}) or {}), m)
        return [list(g) for g in sorted({tuple(sorted(set(g))) for g in groups})]

    entry = {"class": arch, "model_type": model.config.model_type or "", "base_model_prefix": prefix,
             "checkpoint_roots": checkpoint_roots, "model_roots": model_roots, "base_roots": base_roots,
             "renames": rules}
    if hasattr(model.config, "tie_word_embeddings"):
        entry["tied"] = {"true": tie_groups(True), "false": tie_groups(False)}
        entry["tie_word_embeddings"] = bool(model.config.tie_word_embeddings)
    else:
        entry["tied"] = {"always": tie_groups(None)}
    if not exact:
        entry["exact"] = False
        entry["first_difference"] = first_difference
    return entry


def all_classes():
    import transformers
    from transformers import PreTrainedModel
    out = []
    for n in dir(transformers):
        if not n[:1].isupper() or n.endswith("PreTrainedModel"):
            continue
        try:
            c = getattr(transformers, n)
        except Exception:  # noqa: BLE001  (an optional backend missing)
            continue
        if isinstance(c, type) and issubclass(c, PreTrainedModel) and c is not PreTrainedModel and \
                getattr(c, "config_class", None) is not None:
            out.append(n)
    return sorted(out)


def _describe_quietly(arch):
    import warnings
    warnings.filterwarnings("ignore")
    try:
        return describe(arch)
    except Exception as e:  # noqa: BLE001
        return {"class": arch, "error": f"{type(e).__name__}: {str(e)[:160]}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embed", action="store_true", help="only rewrite the .hpp from the committed JSON")
    ap.add_argument("--only", nargs="*", help="classes to print (debugging; writes nothing)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    args = ap.parse_args()
    if not args.embed:
        import torch
        import transformers
        classes = args.only if args.only else all_classes()
        entries = []
        with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=50) as pool:
            for i, e in enumerate(pool.imap(_describe_quietly, classes, chunksize=4)):
                entries.append(e)
                if (i + 1) % 100 == 0 or "error" in e or e.get("exact") is False:
                    note = e.get("error") or e.get("first_difference") or ""
                    print(f"[{i + 1}/{len(classes)}] {e['class']} {note}", file=sys.stderr)
        if args.only:
            print(json.dumps(entries, indent=1))
            return
        ok = [e for e in entries if "error" not in e]
        doc = {
            "format": 1,
            "generator": "tests/compat/gen_names.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0],
            "rule": "a checkpoint name takes the rule whose checkpoint side is its longest matching dotted prefix "
                    "({i} = one all-digit part, linear_{i} = a part of linear_ and digits); the model side takes "
                    "the numbered values in order ({i+1}: the value plus one); one the model side lacks is fused",
            "classes": ok,
            "not_built": {e["class"]: e["error"] for e in entries if "error" in e},
        }
        with open(JSON_PATH, "w") as f:
            json.dump(doc, f, indent=0, separators=(",", ":"))
            f.write("\n")
        print(f"{len(ok)} classes ({sum(1 for e in ok if e['renames'])} with renames, "
              f"{sum(1 for e in ok if e.get('exact') is False)} not exact), {len(entries) - len(ok)} not built",
              file=sys.stderr)
    with open(JSON_PATH) as f:
        text = f.read()
    with open(HPP_PATH, "w") as f:
        f.write(embed_json.render_hpp(text, "names", "tests/compat/gen_names.py", "include/accel/model/data/names.json",
                                         "Checkpoint-to-model name rules of every transformers model class, as string pieces."))


if __name__ == "__main__":
    main()
