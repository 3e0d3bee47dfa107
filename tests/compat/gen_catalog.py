#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Generates accel's architecture catalog from transformers: builds every listed architecture on
the meta device from its config class (the class defaults, no weights) and records what
from_pretrained knows and checkpoint headers do not:

  - no_split_modules, keep_in_fp32_modules(_strict), base_model_prefix, attribute_map;
  - modules in construction order as templates (`model.layers.{i}`), each with its class and the
    local names of its direct parameters and buffers; how many blocks a numbered container
    holds, as an expression over config.json (`num_hidden_layers`);
  - tied parameter groups, for tie_word_embeddings true and false;
  - buffers (persistent or not) with shapes as expressions over config.json and a dtype
    ("model" when it follows the load dtype);
  - the checkpoint conversions transformers applies while loading (renames, expert fusion);
  - defaults: the config class's default for every config key an expression names.

Every expression is checked against the model itself: on the base config and on configs with
one named key changed. Writes include/accel/model/data/catalog.json and the embedded copy
include/accel/model/detail/catalog_data.hpp.

  gen_catalog.py             regenerate both files (needs torch + transformers)
  gen_catalog.py --embed     rewrite only the .hpp from the committed JSON (no torch needed)
"""
import argparse
import dataclasses
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import catalog_expr  # noqa: E402
import embed_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JSON_PATH = os.path.join(ROOT, "include/accel/model/data/catalog.json")
HPP_PATH = os.path.join(ROOT, "include/accel/model/detail/catalog_data.hpp")

# (architecture class, what it covers on the Hub, config overrides for the base build). The
# overrides only make otherwise equal counts differ, so each count finds its own config key.
ARCHITECTURES = [
    ("LlamaForCausalLM", "Llama 2, Llama 3.x", {}),
    ("MistralForCausalLM", "Mistral", {}),
    ("MixtralForCausalLM", "Mixtral", {}),
    ("Qwen2ForCausalLM", "Qwen2, Qwen2.5", {}),
    ("Qwen2MoeForCausalLM", "Qwen1.5-MoE, Qwen2-MoE", {}),
    ("Qwen3ForCausalLM", "Qwen3", {}),
    ("Qwen3MoeForCausalLM", "Qwen3-MoE", {}),
    ("GemmaForCausalLM", "Gemma", {}),
    ("Gemma2ForCausalLM", "Gemma 2", {}),
    ("Gemma3ForCausalLM", "Gemma 3 (text)", {}),
    ("PhiForCausalLM", "Phi-1.5, Phi-2", {}),
    ("Phi3ForCausalLM", "Phi-3, Phi-3.5, Phi-4", {}),
    ("GPT2LMHeadModel", "GPT-2, DistilGPT-2", {}),
    ("GPTJForCausalLM", "GPT-J", {}),
    ("GPTNeoXForCausalLM", "GPT-NeoX, Pythia", {}),
    ("OPTForCausalLM", "OPT", {}),
    ("FalconForCausalLM", "Falcon", {}),
    ("BloomForCausalLM", "BLOOM", {}),
    ("Starcoder2ForCausalLM", "StarCoder2", {}),
    ("OlmoForCausalLM", "OLMo", {}),
    ("Olmo2ForCausalLM", "OLMo 2", {}),
    ("CohereForCausalLM", "Command R", {}),
    ("Cohere2ForCausalLM", "Command R7B", {}),
    ("DeepseekV2ForCausalLM", "DeepSeek-V2", {}),
    ("DeepseekV3ForCausalLM", "DeepSeek-V3, R1", {}),
    ("T5ForConditionalGeneration", "T5, Flan-T5", {"num_decoder_layers": 4}),
    ("MT5ForConditionalGeneration", "mT5", {"num_decoder_layers": 4}),
    ("BartForConditionalGeneration", "BART", {"decoder_layers": 4}),
    ("MBartForConditionalGeneration", "mBART", {"decoder_layers": 4}),
    ("BertModel", "BERT (base model)", {}),
    ("BertForMaskedLM", "BERT (masked LM)", {}),
    ("RobertaModel", "RoBERTa (base model)", {}),
    ("RobertaForMaskedLM", "RoBERTa (masked LM)", {}),
    ("ViTModel", "ViT (base model)", {}),
    ("ViTForImageClassification", "ViT (classifier)", {}),
    ("CLIPModel", "CLIP", {}),
    # Vision-language and speech models (composite configs: counts read from text_config/vision_config).
    ("LlavaForConditionalGeneration", "LLaVA 1.5, Pixtral (llava with a pixtral tower)", {}),
    ("LlavaNextForConditionalGeneration", "LLaVA-NeXT", {}),
    ("LlavaOnevisionForConditionalGeneration", "LLaVA-OneVision", {}),
    ("Qwen2VLForConditionalGeneration", "Qwen2-VL", {}),
    ("Qwen2_5_VLForConditionalGeneration", "Qwen2.5-VL", {}),
    ("Qwen3VLForConditionalGeneration", "Qwen3-VL", {}),
    ("Qwen3VLMoeForConditionalGeneration", "Qwen3-VL MoE", {}),
    ("Gemma3ForConditionalGeneration", "Gemma 3 (multimodal)", {}),
    ("Mistral3ForConditionalGeneration", "Mistral Small 3.1/3.2", {}),
    ("Llama4ForConditionalGeneration", "Llama 4", {}),
    ("Idefics3ForConditionalGeneration", "Idefics3", {}),
    ("SmolVLMForConditionalGeneration", "SmolVLM", {}),
    ("InternVLForConditionalGeneration", "InternVL 3", {}),
    ("PaliGemmaForConditionalGeneration", "PaliGemma", {}),
    ("WhisperForConditionalGeneration", "Whisper", {}),
    ("ModernBertModel", "ModernBERT (base model)", {}),
    ("ModernBertForMaskedLM", "ModernBERT (masked LM)", {}),
    # The newest text families.
    ("GptOssForCausalLM", "gpt-oss", {}),
    ("Qwen3NextForCausalLM", "Qwen3-Next", {}),
    ("Glm4MoeForCausalLM", "GLM-4.5, GLM-4.6 (MoE)", {}),
    ("Ernie4_5_MoeForCausalLM", "ERNIE 4.5 MoE", {}),
    ("SmolLM3ForCausalLM", "SmolLM3", {}),
]

# Hand-written dimension formulas tried before single config keys (first that checks wins).
# {p} is a sub-config prefix ("" or "text_config." ...), for composite configs.
HEAD_DIM = "({p}head_dim ?? {p}hidden_size // {p}num_attention_heads)"
ROTARY_DIM = ("(" + HEAD_DIM + " * ({p}rope_parameters.partial_rotary_factor ?? {p}partial_rotary_factor ?? 1)) // 1")
FORMULAS = [
    "({p}qk_rope_head_dim + 1) // 2",  # DeepSeek's rotary part of each head (old configs lack head_dim)
    "(" + ROTARY_DIM + " + 1) // 2",
    "({p}rotary_dim ?? " + HEAD_DIM + ")",
    "({p}image_size // {p}patch_size) * ({p}image_size // {p}patch_size) + 1",
    "({p}image_size // {p}patch_size) * ({p}image_size // {p}patch_size)",  # SigLIP: no class token
    "({p}hidden_size // {p}num_heads // 2 + 1) // 2",  # Qwen-VL vision rotary: half of half a head
    "({p}embed_dim // {p}num_heads // 2 + 1) // 2",
]
COUNT_FORMULAS = ["{p}num_decoder_layers ?? {p}num_layers"]


def flat_numbers(d, prefix=""):
    """{dotted path: value} for every int/float leaf of a config dict."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_numbers(v, prefix + k + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = v
    return out


def sub_prefixes(config_dict):
    return [""] + [k + "." for k, v in config_dict.items() if isinstance(v, dict) and "model_type" in v]


def names_in(expr):
    return sorted({t for t in catalog_expr.tokens(expr) if t[0].isalpha() or t[0] == "_"})


def template(name):
    """model.layers.3.mlp.experts.7 -> model.layers.{i}.mlp.experts.{j}"""
    letters, out = iter("ijklmnopq"), []
    for part in name.split(".") if name else []:
        out.append("{" + next(letters) + "}" if part.isdigit() else part)
    return ".".join(out)


class Builder:
    def __init__(self, torch, transformers, arch, overrides):
        self.torch, self.tf = torch, transformers
        self.cls = getattr(transformers, arch)
        self.config_class = self.cls.config_class
        self.overrides = dict(overrides)

    def config(self, **changes):
        kwargs = dict(self.overrides)
        kwargs.update(changes)
        return self.config_class(**kwargs)

    def model(self, config, dtype=None):
        torch = self.torch
        old = torch.get_default_dtype()
        if dtype is not None:
            torch.set_default_dtype(dtype)
        try:
            with torch.device("meta"):
                return self.cls(config)
        finally:
            torch.set_default_dtype(old)

    @staticmethod
    def saved(config):
        """What save_pretrained writes as config.json."""
        return json.loads(config.to_json_string())

    def defaults(self):
        out = {}
        for f in dataclasses.fields(self.config_class):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
        return out


def numeric_defaults(builder, names):
    """Class defaults for the expression names. A sub-config name (`text_config.hidden_size`)
    takes the default of the sub-config's own class: Hub configs often write a partial
    `text_config` and transformers fills the rest from that class (names deeper than one
    sub-config level are left out)."""
    d = builder.defaults()
    attribute_map = getattr(builder.config_class, "attribute_map", {})
    base = builder.config()
    out = {}
    for n in names:
        head, _, rest = n.partition(".")
        if rest:
            sub = getattr(base, head, None)
            if sub is None or "." in rest or not hasattr(sub, "to_dict"):
                continue
            sub_class = type(sub)
            sub_key = getattr(sub_class, "attribute_map", {}).get(rest, rest)
            fields = {f.name: f for f in dataclasses.fields(sub_class)} if dataclasses.is_dataclass(sub_class) else {}
            if sub_key in fields:  # the declared default (None stays None: computed from others)
                value = fields[sub_key].default if fields[sub_key].default is not dataclasses.MISSING else None
            else:
                try:
                    value = sub_class().to_dict().get(sub_key)
                except Exception:  # noqa: BLE001  (a sub-config class that needs arguments)
                    value = None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{head}.{sub_key}"] = value
            continue
        key = attribute_map.get(n, n)
        value = d.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def perturbed(value):
    return value * 2 if isinstance(value, int) else value / 2


def choose_expression(builder, base_json, observed, probe, candidates, log):
    """First candidate that gives `observed` on the base config and follows every perturbation of
    the keys it names; probe(config) -> the observed value on a rebuilt model (None: gone)."""
    attribute_map = getattr(builder.config_class, "attribute_map", {})
    for expr in candidates:
        names = names_in(expr)
        defaults = numeric_defaults(builder, names)
        try:
            if catalog_expr.evaluate(expr, base_json, defaults, attribute_map) != observed:
                continue
        except (ValueError, ZeroDivisionError):
            continue
        ok, checked = True, 0
        for n in names:
            value = catalog_expr.lookup(n, base_json, defaults, attribute_map)
            if value is None:
                continue
            head, _, rest = n.partition(".")
            head = attribute_map.get(head, head)
            if rest and ("." in rest or not isinstance(base_json.get(head), dict)):
                continue  # deeper than one level: checked on the base config only
            change = {head: dict(base_json[head], **{rest: perturbed(value)})} if rest else {head: perturbed(value)}
            try:
                cfg = builder.config(**change)
            except Exception:  # the config class rejects the combination: nothing to learn
                continue
            got = probe(cfg)
            if got is None:
                continue
            want = catalog_expr.evaluate(expr, Builder.saved(cfg), defaults, attribute_map)
            checked += 1
            if got != want:
                ok = False
                break
        if ok:
            if checked == 0 and names:
                log(f"    note: {expr!r} checked on the base config only")
            return expr
    return None


def candidates_for(value, base_json, formulas):
    out = [str(value)] if value in (0, 1) else []
    for p in sub_prefixes(base_json):
        out += [f.format(p=p) for f in formulas]
    out += [k for k, v in flat_numbers(base_json).items() if v == value and isinstance(v, int)]
    return out


def describe(torch, transformers, arch, covers, overrides, log):
    b = Builder(torch, transformers, arch, overrides)
    cfg = b.config()
    base_json = Builder.saved(cfg)
    model = b.model(cfg)
    attribute_map = dict(getattr(b.config_class, "attribute_map", {}))

    # Modules in construction (pre-)order as templates; numbered containers get a count.
    modules, by_key, containers = [], {}, {}
    for name, mod in model.named_modules():
        t = template(name)
        params = [n for n, _ in mod.named_parameters(recurse=False)]
        bufs = [n for n, _ in mod.named_buffers(recurse=False)]
        kids = [template(n) for n, _ in mod.named_children()]
        key = (t, type(mod).__name__)
        if key not in by_key:
            by_key[key] = {"path": t, "class": type(mod).__name__, "parameters": params, "buffers": bufs}
            modules.append(by_key[key])
        children = list(mod.named_children())
        if children and all(n.isdigit() for n, _ in children):
            containers.setdefault(t, name)
    # A template with several classes (dense and MoE layers): keep each class's child names so
    # a tree from headers can tell them apart.
    paths = [m["path"] for m in modules]
    for m in modules:
        if paths.count(m["path"]) > 1:
            m["children"] = sorted({
                template(n).rsplit(".", 1)[-1] for n, mm in model.named_modules()
                if template(n).rsplit(".", 1)[0] == m["path"] and n.count(".") == m["path"].count(".") + 1
                and type(model.get_submodule(n.rsplit(".", 1)[0])).__name__ == m["class"]})

    repeats = {}
    for t, name in containers.items():
        count = len(list(model.get_submodule(name).children()))

        def probe(c, name=name):
            try:
                return len(list(b.model(c).get_submodule(name).children()))
            except AttributeError:
                return None

        expr = choose_expression(b, base_json, count, probe, candidates_for(count, base_json, COUNT_FORMULAS), log)
        if expr is None:
            log(f"    no config key gives the count of {t} ({count}); recorded as a constant")
            expr = str(count)
        repeats[t] = expr

    # Buffers: dtype in a bf16 build tells whether they follow the load dtype.
    low = b.model(cfg, torch.bfloat16)
    low_dtypes = {n: t.dtype for n, t in low.named_buffers()}
    buffers, seen = [], set()
    for name, buf in model.named_buffers():
        t = template(name)
        if t in seen:
            continue
        seen.add(t)
        owner, _, local = name.rpartition(".")
        persistent = local not in model.get_submodule(owner)._non_persistent_buffers_set
        dtype = "model" if low_dtypes[name] != buf.dtype else str(buf.dtype).replace("torch.", "")
        shape = []
        for axis, size in enumerate(buf.shape):
            def probe(c, name=name, axis=axis):
                bufs = dict(b.model(c).named_buffers())
                return bufs[name].shape[axis] if name in bufs and axis < len(bufs[name].shape) else None

            expr = choose_expression(b, base_json, size, probe, candidates_for(size, base_json, FORMULAS), log)
            if expr is None:
                log(f"    no expression for {t} axis {axis} ({size}); recorded as a constant")
                expr = str(size)
            shape.append(expr)
        buffers.append({"name": t, "shape": shape, "dtype": dtype, "persistent": persistent})

    def tie_groups(tie):
        if not hasattr(cfg, "tie_word_embeddings"):
            return []
        m = b.model(b.config(tie_word_embeddings=tie))
        keys = dict(m.all_tied_weights_keys)
        groups = {tuple(sorted([k for k, v in keys.items() if v == src] + [src])) for src in set(keys.values())}
        out = []
        for g in sorted(groups):
            tg = [template(n) for n in g]
            if tg not in out:
                out.append(tg)
        return out

    from transformers.conversion_mapping import get_model_conversion_mapping
    conversions = [{"kind": type(c).__name__, "source": list(c.source_patterns), "target": list(c.target_patterns),
                    "operations": [type(o).__name__ for o in getattr(c, "operations", [])]}
                   for c in get_model_conversion_mapping(model, add_legacy=False)]

    names = set()
    for e in list(repeats.values()) + [d for bb in buffers for d in bb["shape"]]:
        if e:
            names.update(names_in(e))
    defaults = numeric_defaults(b, sorted(names))
    for flag in ("tie_word_embeddings", "is_encoder_decoder"):
        if flag in b.defaults():
            defaults[flag] = b.defaults()[flag]

    return {
        "architecture": arch,
        "covers": covers,
        "model_type": b.config_class.model_type,
        "config_class": b.config_class.__name__,
        "base_model_prefix": model.base_model_prefix,
        "attribute_map": attribute_map,
        "defaults": defaults,
        "no_split_modules": sorted(model._no_split_modules or []),
        "keep_in_fp32_modules": sorted(model._keep_in_fp32_modules or []),
        "keep_in_fp32_modules_strict": sorted(model._keep_in_fp32_modules_strict or []),
        "tied": {"true": tie_groups(True), "false": tie_groups(False)},
        "modules": modules,
        "repeats": repeats,
        "buffers": buffers,
        "conversions": conversions,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embed", action="store_true", help="only rewrite the .hpp from the committed JSON")
    ap.add_argument("--only", nargs="*", help="architectures to print (debugging; writes nothing)")
    args = ap.parse_args()
    if not args.embed:
        import torch
        import transformers
        transformers.logging.set_verbosity_error()
        log = lambda s: print(s, file=sys.stderr)  # noqa: E731
        entries = []
        listed = ARCHITECTURES if not args.only else \
            [a for a in ARCHITECTURES if a[0] in args.only] + [(a, a, {}) for a in args.only if a not in {x[0] for x in ARCHITECTURES}]
        for arch, covers, overrides in listed:
            log(f"{arch}")
            entries.append(describe(torch, transformers, arch, covers, overrides, log))
        catalog = {
            "format": 1,
            "generator": "tests/compat/gen_catalog.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0],
            "expression_syntax": "numbers, dotted config.json names, + - * // ( ) and a ?? b (b when a is absent or null)",
            "architectures": entries,
        }
        text = json.dumps(catalog, indent=1) + "\n"
        if args.only is not None:
            print(text)
            return
        os.makedirs(os.path.dirname(JSON_PATH), exist_ok=True)
        with open(JSON_PATH, "w") as f:
            f.write(text)
    with open(JSON_PATH) as f:
        text = f.read()
    with open(HPP_PATH, "w") as f:
        f.write(embed_json.render_hpp(text, "catalog", "tests/compat/gen_catalog.py", "include/accel/model/data/catalog.json",
                                         "The architecture catalog as string pieces, so reading it needs no file at run time."))


if __name__ == "__main__":
    main()
