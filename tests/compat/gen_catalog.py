#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Generates accel's architecture catalog from transformers: every class of the auto mappings
accel plans for (MAPPINGS: causal LM, image-text-to-text, seq2seq, speech seq2seq, CTC, masked
LM, base models, image classification) is built on the meta device from its config class (the
class defaults, no weights), each in a worker process with a time limit, and the catalog records
what from_pretrained knows and checkpoint headers do not:

  - no_split_modules, keep_in_fp32_modules(_strict), base_model_prefix, attribute_map;
  - modules in construction order as templates (`model.layers.{i}`), each with its class and the
    local names of its direct parameters and buffers (and, where a template has several classes,
    each class's child names in registration order; the parameters a module creates in a dtype
    of its own, which the strict keep-in-fp32 list does not cover); how many blocks a numbered
    container holds, as an expression over config.json (`num_hidden_layers`);
  - tied parameter groups, for tie_word_embeddings true and false (a config without the flag,
    such as EncoderDecoderConfig, gets the ties its sub-models make by default under both);
  - buffers (persistent or not) with shapes as expressions over config.json and a dtype
    ("model" when it follows the load dtype); a block whose computed buffer differs from its
    template's first (LeViT's stages) gets an entry by its own name, which replaces the template there;
  - the checkpoint conversions transformers applies while loading (renames, expert fusion);
  - defaults: the config class's default for every config key an expression names.

Every expression is checked against the model itself: on the base config and on configs with
one named key changed (per-layer lists such as layer_types doubled along with a doubled count
when the config demands equal lengths). A count is also checked against every other config key
that holds the same value: T5's num_decoder_layers copies num_layers unless given, so only
`num_decoder_layers ?? num_layers` follows the decoder's count when either changes. A config
whose defaults do not build because head_dim is left None is built with head_dim set from
hidden_size // num_attention_heads (the catalog's defaults stay the class's own). A class that
cannot be built or described (another package needed, a config without usable defaults, a
build over SLOW_BUILD_S seconds, a worker that crashes or runs past --timeout) is listed under
"skipped" with the reason.

Format 2 (read by include/accel/model/architecture.hpp): a head class shares its base model's
entry ("base", "base_path") where the entry spliced back together is exactly the class's own
full extraction (every entry is expanded and compared before anything is written), and empty
lists are left out. The hand-picked classes (ARCHITECTURES) must come out as the format-1
committed catalog.json has them. It writes include/accel/model/data/catalog.json and its embedded
copy include/accel/model/detail/catalog_data.hpp.

  gen_catalog.py                 regenerate both files (needs torch + transformers; ~40 min on 2 cores)
  gen_catalog.py --embed         rewrite only the .hpp from the committed JSON (no torch needed)
  gen_catalog.py --list-skipped  print the committed catalog's skipped classes and reasons (no torch)
  gen_catalog.py --only A,B      build some classes and print their full entries (writes nothing)
  gen_catalog.py --cache FILE    keep each class's result in FILE (JSON lines) and reuse it on the
                                 next run (a class is rebuilt when FILE lacks it)
"""
import argparse
import collections
import dataclasses
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import catalog_expr  # noqa: E402
import embed_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JSON_PATH = os.path.join(ROOT, "include/accel/model/data/catalog.json")
HPP_PATH = os.path.join(ROOT, "include/accel/model/detail/catalog_data.hpp")
# The format-1 catalog the hand-picked classes below were first written to: their entries must
# come out the same (checked on every full run while the file exists).
FORMAT1_PATH = os.path.join(ROOT, "include/accel/model/data/catalog.json")

# The auto mappings whose classes the catalog covers (a name this transformers lacks is left out).
MAPPINGS = [
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
]
SLOW_BUILD_S = 60  # one meta-device build slower than this: skipped (the checks rebuild it dozens of times)
TIMEOUT_S = 300  # a worker describing one class is stopped after this long

# The classes first catalogued by hand: (architecture class, what it covers on the Hub, config
# overrides for the base build). The overrides only make otherwise equal counts differ, so each
# count finds its own config key; every other mapped class is built from its config class's
# defaults as they are, with no "covers".
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
    ("GPTNeoForCausalLM", "GPT-Neo", {}),
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


def tie_group_templates(tied, model):
    """transformers' tie groups ({tied name: the name it shares}, all_tied_weights_keys) as
    templates. A group stands for one group per value of its placeholders, which share a value
    across its names: `{i}` ranges over the blocks of the container it numbers (all the containers
    it numbers, where it appears more than once), `{i+1}` is that value plus one. Groups alike but
    for their numbers become one template where the blocks' count reproduces them exactly
    (Bark's `fine_acoustics.lm_heads.{i}` with `fine_acoustics.input_embeds_layers.{i+1}`);
    numbers that do not vary are written out (Udop's `encoder.relative_bias.biases.0` with
    `encoder.block.0.layer.0.SelfAttention.relative_attention_bias`, not every block's), and
    groups no template reproduces are written out one by one. A group of one template (a module
    several blocks share) stays that template, repeated: every block the model builds of it."""
    groups = collections.defaultdict(set)
    for name, source in tied.items():
        groups[source].update((name, source))

    def numbers(n):
        return [int(p) for p in n.split(".") if p.isdigit()]

    def count(path):
        try:
            return len(model.get_submodule(path))
        except Exception:  # noqa: BLE001  (not a container)
            return None

    families = collections.OrderedDict()
    for members in groups.values():
        ordered = sorted(members, key=lambda n: (template(n), numbers(n)))
        families.setdefault(tuple(template(n) for n in ordered), []).append(ordered)
    out = []
    for family in families.values():
        family.sort(key=lambda g: [numbers(n) for n in g])
        first = family[0]
        if len(family) == 1 and len(first) > 1 and len({template(n) for n in first}) == 1 and numbers(first[0]):
            # One module shared by several blocks (Zamba's transformer block, in the layers its
            # config picks): the template once per name, every block of it that the model builds.
            out.append([template(n) for n in first])
            continue
        # Each number of each name: (name index, which number) -> its values along the family.
        slots = [(k, q) for k, n in enumerate(first) for q in range(len(numbers(n)))]
        values = {s: [numbers(g[s[0]])[s[1]] for g in family] for s in slots}
        spelled, letters = {}, []  # letters: (slot that defines it, letter)
        for s in slots:
            v = values[s]
            if len(family) == 1 or len(set(v)) == 1:
                spelled[s] = str(v[0])
                continue
            for base, letter in letters:
                d = v[0] - values[base][0]
                if all(a - b == d for a, b in zip(v, values[base])):
                    spelled[s] = "{" + letter + (f"{d:+d}" if d else "") + "}"
                    break
            else:
                letter = "ijklmnopq"[len(letters)]
                letters.append((s, letter))
                spelled[s] = "{" + letter + "}"

        def spell(k, name):
            parts, q = [], 0
            for p in name.split("."):
                if p.isdigit():
                    parts.append(spelled[(k, q)])
                    q += 1
                else:
                    parts.append(p)
            return ".".join(parts)

        group = [spell(k, n) for k, n in enumerate(first)]
        # What accel expands it to (architecture.hpp tied_groups): each letter over the values its
        # containers all have blocks for.
        ranges = []
        for base, letter in letters:
            allowed = None
            for k, name in enumerate(group):
                parts = name.split(".")
                for at, p in enumerate(parts):
                    if not (p.startswith("{" + letter) and p.endswith("}")):
                        continue
                    offset = int(p[2:-1] or 0)
                    container = ".".join(first[k].split(".")[:at])
                    n = count(container)
                    if n is None:
                        continue
                    here = {v for v in range(-offset, n - offset)}
                    allowed = here if allowed is None else allowed & here
            ranges.append(sorted(allowed or ()))
        expected = set()
        for chosen in _product_of(ranges):
            value = dict(zip([letter for _, letter in letters], chosen))
            expected.add(tuple(sorted(_fill(t, value) for t in group)))
        if letters and expected == {tuple(sorted(g)) for g in family}:
            out.append(sorted(group))
        else:
            out.extend(sorted(g) for g in family)
    return sorted(out)


def _product_of(ranges):
    if not ranges:
        yield ()
        return
    for first in ranges[0]:
        for rest in _product_of(ranges[1:]):
            yield (first,) + rest


def _fill(name, value):
    """A tie template's name for placeholder values {letter: value} (`{i+1}` is value + 1)."""
    out = []
    for p in name.split("."):
        if p.startswith("{") and p.endswith("}"):
            out.append(str(value[p[1]] + int(p[2:-1] or 0)))
        else:
            out.append(p)
    return ".".join(out)


class Builder:
    def __init__(self, torch, transformers, arch, overrides):
        self.torch, self.tf = torch, transformers
        self.cls = getattr(transformers, arch)
        self.config_class = self.cls.config_class
        if self.config_class is None:
            raise TypeError(f"{arch} names no config_class")
        self.overrides = dict(overrides)
        # The checks build the same changed config for several counts and buffer axes: what the
        # probes read from each build (container sizes, buffer shapes) is kept, keyed by
        # config.json, and the last two models.
        self._models = collections.OrderedDict()
        self._summaries = collections.OrderedDict()
        self._base = None
        self.watched = set()  # module names whose child count the probes read

    def base_config(self):
        if self._base is None:
            self._base = self.config()
        return self._base

    def config(self, **changes):
        kwargs = dict(self.overrides)
        kwargs.update(changes)
        return self.config_class(**kwargs)

    def model(self, config, dtype=None):
        key = (config.to_json_string(), str(dtype))
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        torch = self.torch
        old = torch.get_default_dtype()
        if dtype is not None:
            torch.set_default_dtype(dtype)
        try:
            with torch.device("meta"):
                model = self.cls(config)
        finally:
            torch.set_default_dtype(old)
        self._models[key] = model
        while len(self._models) > 2:
            self._models.popitem(last=False)
        return model

    def summary(self, config):
        """{"children": {watched module: child count}, "buffers": {name: shape}} of the model
        built from config."""
        key = config.to_json_string()
        if key in self._summaries:
            self._summaries.move_to_end(key)
            return self._summaries[key]
        model = self.model(config)
        children = {}
        for name in self.watched:
            try:
                children[name] = len(list(model.get_submodule(name).children()))
            except AttributeError:
                pass
        out = {"children": children, "buffers": {n: tuple(b.shape) for n, b in model.named_buffers()}}
        self._summaries[key] = out
        while len(self._summaries) > 256:
            self._summaries.popitem(last=False)
        return out

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
    base = builder.base_config()
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


def changed_config(builder, base_json, name, value, attribute_map):
    """The config with one named key perturbed, or None when it cannot be changed alone (deeper
    than one sub-config level, or the config class refuses the value)."""
    head, _, rest = name.partition(".")
    head = attribute_map.get(head, head)
    if rest and ("." in rest or not isinstance(base_json.get(head), dict)):
        return None  # deeper than one level: checked on the base config only
    change = {head: dict(base_json[head], **{rest: perturbed(value)})} if rest else {head: perturbed(value)}
    try:
        return builder.config(**change)
    except Exception:  # noqa: BLE001  (the config class rejects the combination)
        pass
    # A layer count often comes with per-layer lists of that length (layer_types) the config
    # checks against it: doubled with the count, the pattern repeated.
    where = base_json[head] if rest else base_json
    lists = {k: v * 2 for k, v in where.items()
             if isinstance(v, list) and isinstance(value, int) and value > 0 and len(v) == value}
    if not lists:
        return None
    change = {head: dict(base_json[head], **{rest: perturbed(value)}, **lists)} if rest else \
        dict(lists, **{head: perturbed(value)})
    try:
        return builder.config(**change)
    except Exception:  # noqa: BLE001  (the config class rejects the combination: nothing to learn)
        return None


def follows(builder, base_json, expr, names, defaults, probe, attribute_map):
    """(whether expr follows the model when each of `names` is perturbed, how many were checked)."""
    checked = 0
    for n in names:
        value = catalog_expr.lookup(n, base_json, defaults, attribute_map)
        if value is None:
            continue
        cfg = changed_config(builder, base_json, n, value, attribute_map)
        if cfg is None:
            continue
        try:
            got = probe(cfg)
        except Exception:  # noqa: BLE001  (the changed config does not build: nothing to learn)
            continue
        if got is None:
            continue
        want = catalog_expr.evaluate(expr, Builder.saved(cfg), defaults, attribute_map)
        checked += 1
        if got != want:
            return False, checked
    return True, checked


def choose_expression(builder, base_json, observed, probe, candidates, log, also=()):
    """First candidate that gives `observed` on the base config and follows every perturbation of
    the keys it names; probe(config) -> the observed value on a rebuilt model (None: gone).
    With `also` (config keys holding the same value), a candidate must also follow their
    perturbations: a key another one defaults from (T5's num_layers, which num_decoder_layers
    copies unless given) then loses to the key that moves the count alone. Where no candidate
    passes that, the first that passes its own keys is taken."""
    attribute_map = getattr(builder.config_class, "attribute_map", {})
    fallback = None
    for expr in candidates:
        names = names_in(expr)
        defaults = numeric_defaults(builder, names)
        try:
            if catalog_expr.evaluate(expr, base_json, defaults, attribute_map) != observed:
                continue
        except (ValueError, ZeroDivisionError):
            continue
        ok, checked = follows(builder, base_json, expr, names, defaults, probe, attribute_map)
        if not ok:
            continue
        if checked == 0 and names:
            log(f"    note: {expr!r} checked on the base config only")
        others = [k for k in also if k not in names]
        if not others:
            return expr
        if follows(builder, base_json, expr, others, defaults, probe, attribute_map)[0]:
            return expr
        if fallback is None:
            fallback = expr
    if fallback is not None:
        log(f"    note: {fallback!r} does not follow every key of the same value; taken as the best found")
    return fallback


def candidates_for(value, base_json, formulas):
    out = [str(value)] if value in (0, 1) else []
    for p in sub_prefixes(base_json):
        out += [f.format(p=p) for f in formulas]
    out += [k for k, v in flat_numbers(base_json).items() if v == value and isinstance(v, int)]
    return out


class SlowBuild(Exception):
    pass


def repairs(config):
    """Overrides that let a config whose defaults do not build be built: a head_dim left None
    (computed by the model from hidden_size and num_attention_heads in most classes, but not
    in all), at the top level or in a sub-config. {} when there is nothing to repair."""
    def head_dim(c):
        if getattr(c, "head_dim", 0) is None and getattr(c, "hidden_size", None) and getattr(c, "num_attention_heads", None):
            return c.hidden_size // c.num_attention_heads
        return None

    out = {}
    if head_dim(config) is not None:
        out["head_dim"] = head_dim(config)
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict") and head_dim(sub) is not None:
            out[key] = dict(Builder.saved(sub), head_dim=head_dim(sub))
    return out


def build_default(torch, transformers, arch, overrides, log):
    """(builder, config, meta model, seconds the build took) of a class at its config class's
    defaults (with `overrides`), repaired (see repairs) when the defaults do not build."""
    b = Builder(torch, transformers, arch, overrides)
    cfg = b.base_config()
    started = time.monotonic()
    try:
        model = b.model(cfg)
    except Exception as error:  # noqa: BLE001  (a default the model cannot use: repaired, else raised)
        fix = repairs(cfg)
        if not fix:
            raise
        log(f"    note: the defaults do not build ({skip_reason(error)}); built with {sorted(fix)} set")
        b = Builder(torch, transformers, arch, dict(overrides, **fix))
        cfg = b.base_config()
        started = time.monotonic()
        try:
            model = b.model(cfg)
        except Exception:  # noqa: BLE001
            raise error from None
    return b, cfg, model, time.monotonic() - started


def multi_class_children(model, paths, path, cls):
    """{"children": the local names of the children of the modules at template `path` of class
    `cls`, in construction order} when several templates of `paths` are `path`, else {}."""
    if paths.count(path) < 2:
        return {}
    out = []
    for n, _ in model.named_modules():
        parent, _, local = template(n).rpartition(".")
        if parent == path and n.count(".") == path.count(".") + 1 and \
                type(model.get_submodule(n.rsplit(".", 1)[0])).__name__ == cls and local not in out:
            out.append(local)
    return {"children": out}


def tied_field(b, cfg, model):
    """An entry's "tied": the tie groups (tie_group_templates) for tie_word_embeddings true and
    false; a config without the flag ties what its model ties (Bark's fine acoustics heads), the
    same groups for both."""
    def groups(tie):
        m = b.model(b.config(tie_word_embeddings=tie)) if hasattr(cfg, "tie_word_embeddings") else model
        return tie_group_templates(dict(m.all_tied_weights_keys), m)

    return {"true": groups(True), "false": groups(False)}


def describe(torch, transformers, arch, covers, overrides, log, slow_build_s=None):
    """The full (format-1) entry of one class; covers "" when none is given."""
    b, cfg, model, took = build_default(torch, transformers, arch, overrides, log)
    base_json = Builder.saved(cfg)
    if slow_build_s is not None and took > slow_build_s:
        raise SlowBuild(f"one meta-device build takes {took:.0f} s (over {slow_build_s} s; the checks rebuild it many times)")
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
    # a tree from headers can tell them apart, in construction order (T5's feed-forward sub-layer
    # builds DenseReluDense before layer_norm, its attention sub-layer SelfAttention first: the
    # templates' order cannot say both).
    for m in modules:
        m.update(multi_class_children(model, [x["path"] for x in modules], m["path"], m["class"]))

    repeats = {}
    b.watched = set(containers.values())
    for t, name in containers.items():
        count = len(list(model.get_submodule(name).children()))

        def probe(c, name=name):
            return b.summary(c)["children"].get(name)

        same = [k for k, v in flat_numbers(base_json).items() if v == count and isinstance(v, int)]
        expr = choose_expression(b, base_json, count, probe, candidates_for(count, base_json, COUNT_FORMULAS), log,
                                 also=same)
        if expr is None:
            log(f"    no config key gives the count of {t} ({count}); recorded as a constant")
            expr = str(count)
        repeats[t] = expr

    # Buffers: dtype in a bf16 build tells whether they follow the load dtype.
    low = b.model(cfg, torch.bfloat16)
    low_dtypes = {n: t.dtype for n, t in low.named_buffers()}
    # Parameters the model creates in a dtype of their own (Reformer's axial position weights,
    # float32 whatever the load dtype): from_pretrained sizes and loads them in it. Those the
    # strict keep-in-fp32 list already keeps in float32 (routers' gate.weight) are left to it.
    strict = list(model._keep_in_fp32_modules_strict or [])
    for name, p in low.named_parameters():
        if not p.is_floating_point() or p.dtype == torch.bfloat16:
            continue
        if any(re.search(k.replace("*", ".*"), name) for k in strict):
            continue
        owner, _, local = name.rpartition(".")
        m = by_key[(template(owner), type(low.get_submodule(owner)).__name__)]
        m.setdefault("dtypes", {}).setdefault(local, str(p.dtype).replace("torch.", ""))
    buffers, seen, varied = [], {}, set()
    for name, buf in model.named_buffers():
        t = template(name)
        owner, _, local = name.rpartition(".")
        persistent = local not in model.get_submodule(owner)._non_persistent_buffers_set
        if t in seen:
            if tuple(buf.shape) == seen[t] or persistent:
                continue  # a persistent buffer's shape is the checkpoint's
            # Blocks of different sizes (LeViT's stages): the block whose computed buffer differs
            # from the template's first gets an entry of its own, which replaces the template's there.
            if t not in varied:
                varied.add(t)
                log(f"    note: {name} is {tuple(buf.shape)}, not the template {t}'s {seen[t]}: recorded by name")
            t = name
        else:
            seen[t] = tuple(buf.shape)
        dtype = "model" if low_dtypes[name] != buf.dtype else str(buf.dtype).replace("torch.", "")
        shape = []
        for axis, size in enumerate(buf.shape):
            def probe(c, name=name, axis=axis):
                bufs = b.summary(c)["buffers"]
                return bufs[name][axis] if name in bufs and axis < len(bufs[name]) else None

            expr = choose_expression(b, base_json, size, probe, candidates_for(size, base_json, FORMULAS), log)
            if expr is None:
                log(f"    no expression for {t} axis {axis} ({size}); recorded as a constant")
                expr = str(size)
            shape.append(expr)
        buffers.append({"name": t, "shape": shape, "dtype": dtype, "persistent": persistent})

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
        "covers": covers or "",
        "model_type": b.config_class.model_type,
        "config_class": b.config_class.__name__,
        "base_model_prefix": model.base_model_prefix,
        "attribute_map": attribute_map,
        "defaults": defaults,
        "no_split_modules": sorted(model._no_split_modules or []),
        "keep_in_fp32_modules": sorted(model._keep_in_fp32_modules or []),
        "keep_in_fp32_modules_strict": sorted(model._keep_in_fp32_modules_strict or []),
        "tied": tied_field(b, cfg, model),
        "modules": modules,
        "repeats": repeats,
        "buffers": buffers,
        "conversions": conversions,
    }


# ---------------------------------------------------------------------------------------------
# Which classes: the mappings.

# Classes left out on purpose, with the reason (they build, but an entry would be wrong).
SKIP_ON_PURPOSE = {
    "Zamba2Model": "shares one transformer block among several layers (the same parameters under several paths); "
                   "the catalog cannot express a module registered twice yet",
    "Zamba2ForCausalLM": "shares one transformer block among several layers (the same parameters under several paths); "
                         "the catalog cannot express a module registered twice yet",
}


def mapped_classes(modeling_auto):
    """{mapping name: sorted class names} for the MAPPINGS this transformers has (tuple values
    flattened)."""
    out = {}
    for mapping in MAPPINGS:
        names = getattr(modeling_auto, mapping, None)
        if names is None:
            continue
        classes = set()
        for value in names.values():
            classes.update(value if isinstance(value, (list, tuple)) else [value])
        out[mapping] = sorted(classes)
    return out


def skip_reason(error):
    """The exception's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    first = lines[0].strip() if lines else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


_LIBRARY = re.compile(r"requires the (\S+) librar|No module named '([^'.]+)|requires `?([A-Za-z0-9_-]+)`? to be installed")


def reason_category(reason):
    """A short category for the report: `needs timm`, `timeout`, `TypeError`, ..."""
    m = _LIBRARY.search(reason)
    if m:
        return "needs " + next(g for g in m.groups() if g)
    return reason.split(":", 1)[0]


# ---------------------------------------------------------------------------------------------
# Building each class in a worker process.

def _work(conn, work, arch, covers, overrides, slow_build_s, quiet):
    """In a forked worker: work(...) on one class (describe, unless another is given) and send
    {"entry": its result} or {"reason"}, with its log."""
    if quiet:  # transformers and torch warn on stdout/stderr; the log goes back over the pipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    logs = []
    started = time.monotonic()
    try:
        import torch
        import transformers
        torch.set_num_threads(1)
        result = {"entry": work(torch, transformers, arch, covers, overrides, logs.append, slow_build_s)}
    except BaseException as e:  # noqa: BLE001  (anything one class raises skips that class only)
        result = {"reason": skip_reason(e)}
    result.update(architecture=arch, log=logs, seconds=round(time.monotonic() - started, 1))
    try:
        conn.send(result)
    finally:
        conn.close()
        os._exit(0)


def build_all(classes, jobs, timeout_s, slow_build_s, on_result, quiet=True, work=None):
    """Describes each class (or runs work(torch, transformers, arch, covers, overrides, log,
    slow_build_s) on it) in its own forked process, `jobs` at a time; a worker that crashes or
    runs past timeout_s is stopped and its class skipped. on_result(result) gets each
    {"architecture", "entry" | "reason", "log", "seconds"} as it comes."""
    work = work or describe
    hand = {a: (c, o) for a, c, o in ARCHITECTURES}
    ctx = multiprocessing.get_context("fork")
    pending, running = collections.deque(classes), {}
    while pending or running:
        while pending and len(running) < jobs:
            arch = pending.popleft()
            covers, overrides = hand.get(arch, ("", {}))
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_work, args=(writer, work, arch, covers, overrides, slow_build_s, quiet), daemon=True)
            proc.start()
            writer.close()
            running[reader] = (proc, arch, time.monotonic())
        waitables = list(running) + [proc.sentinel for proc, _, _ in running.values()]
        multiprocessing.connection.wait(waitables, timeout=1.0)
        for reader, (proc, arch, started) in list(running.items()):
            result = None
            if reader.poll():
                try:
                    result = reader.recv()
                except (EOFError, OSError):
                    result = {"reason": f"worker crashed (exit code {proc.exitcode})"}
            elif not proc.is_alive():
                proc.join()
                result = {"reason": f"worker crashed (exit code {proc.exitcode})"}
            elif time.monotonic() - started > timeout_s:
                proc.kill()
                result = {"reason": f"timeout: describing it took over {timeout_s} s"}
            if result is None:
                continue
            proc.join()
            reader.close()
            del running[reader]
            result.setdefault("architecture", arch)
            result.setdefault("log", [])
            result.setdefault("seconds", round(time.monotonic() - started, 1))
            on_result(result)


# ---------------------------------------------------------------------------------------------
# Format 2: shared base models, empty lists left out, and the expansion that undoes both.

ENTRY_KEYS = ["architecture", "covers", "model_type", "config_class", "base_model_prefix", "attribute_map", "defaults",
              "no_split_modules", "keep_in_fp32_modules", "keep_in_fp32_modules_strict", "tied", "modules", "repeats",
              "buffers", "conversions"]
# Taken from the base entry when a sharing entry leaves them out.
INHERITED = ["model_type", "config_class", "attribute_map", "no_split_modules", "keep_in_fp32_modules",
             "keep_in_fp32_modules_strict", "conversions"]
# Left out of an entry without a base when empty (the reader reads absent as empty).
OMITTED_WHEN_EMPTY = ["covers", "attribute_map", "defaults", "keep_in_fp32_modules", "keep_in_fp32_modules_strict",
                      "repeats", "buffers", "conversions"]
EMPTY = {"covers": "", "attribute_map": {}, "defaults": {}, "keep_in_fp32_modules": [],
         "keep_in_fp32_modules_strict": [], "repeats": {}, "buffers": [], "conversions": []}


def full_module(m):
    """A format-1 module: parameters and buffers always there, children and dtypes only when not
    empty."""
    out = {"path": m["path"], "class": m["class"], "parameters": list(m.get("parameters", [])),
           "buffers": list(m.get("buffers", []))}
    if m.get("children"):
        out["children"] = list(m["children"])
    if m.get("dtypes"):
        out["dtypes"] = dict(m["dtypes"])
    return out


def normalized(entry):
    """A full (format-1) entry in one canonical shape, for comparisons: every field there
    (absent ones empty), modules through full_module."""
    out = {k: entry.get(k, EMPTY.get(k)) for k in ENTRY_KEYS}
    out["modules"] = [full_module(m) for m in entry["modules"]]
    return out


def compact_module(m):
    out = {"path": m["path"], "class": m["class"]}
    for k in ("parameters", "buffers", "children", "dtypes"):
        if m.get(k):
            out[k] = m[k]
    return out


def compact_entry(full):
    """A format-2 entry without a base: the full entry with empty lists and objects left out."""
    out = {}
    for k in ENTRY_KEYS:
        if k in OMITTED_WHEN_EMPTY and not full[k]:
            continue
        out[k] = [compact_module(m) for m in full[k]] if k == "modules" else full[k]
    return out


def expand(entry, by_name):
    """The full (format-1) entry a format-2 entry stands for, as the reader builds it."""
    if "base" not in entry:
        return normalized(entry)
    base_entry = by_name[entry["base"]]
    assert "base" not in base_entry, f"{entry['architecture']}: base {entry['base']} has a base itself"
    base = normalized(base_entry)
    at = entry["base_path"]
    assert at, f"{entry['architecture']}: empty base_path"

    def prefixed(path):
        return at if not path else at + "." + path

    out = {}
    for k in ENTRY_KEYS:
        if k in INHERITED:
            out[k] = entry[k] if k in entry else base[k]
        elif k == "defaults":
            out[k] = dict(base["defaults"], **entry.get("defaults", {}))
        else:
            out[k] = entry.get(k, EMPTY.get(k))
    modules, markers = [], 0
    for m in entry["modules"]:
        if m.get("base"):
            assert m["path"] == at, f"{entry['architecture']}: base marker at {m['path']!r}, base_path {at!r}"
            markers += 1
            modules += [dict(full_module(bm), path=prefixed(bm["path"])) for bm in base["modules"]]
        else:
            modules.append(full_module(m))
    assert markers == 1, f"{entry['architecture']}: {markers} base markers in modules"
    out["modules"] = modules
    base_buffers = [dict(bb, name=prefixed(bb["name"])) for bb in base["buffers"]]
    if "buffers" not in entry:
        out["buffers"] = base_buffers
    else:
        buffers = []
        for bb in entry["buffers"]:
            buffers += base_buffers if bb.get("base") else [bb]
        assert sum(1 for bb in entry["buffers"] if bb.get("base")) == 1, f"{entry['architecture']}: buffer markers"
        out["buffers"] = buffers
    repeats = dict(entry.get("repeats", {}))
    for path, expr in base["repeats"].items():
        repeats.setdefault(prefixed(path), expr)
    out["repeats"] = repeats
    return out


def subtree_run(modules, at):
    """(first, end) of the contiguous run of modules at `at` and below, or None when they are not
    contiguous or there are none."""
    inside = [i for i, m in enumerate(modules) if m["path"] == at or m["path"].startswith(at + ".")]
    if not inside or inside != list(range(inside[0], inside[-1] + 1)):
        return None
    return inside[0], inside[-1] + 1


def shared_entry(full, base_full, at):
    """The format-2 entry of `full` with `base_full` (a full entry) at module path `at`, or None
    when the base's modules or buffers do not sit there as one run (the caller still checks the
    result by expanding it)."""
    run = subtree_run(full["modules"], at)
    if run is None:
        return None
    first, end = run
    modules = [compact_module(m) for m in full["modules"][:first]] + [{"path": at, "base": True}] + \
              [compact_module(m) for m in full["modules"][end:]]
    prefix = at + "."
    base_names = [prefix + bb["name"] for bb in base_full["buffers"]]
    names = [bb["name"] for bb in full["buffers"]]
    if base_names:
        try:
            start = names.index(base_names[0])
        except ValueError:
            return None
    else:
        inside = [i for i, n in enumerate(names) if n.startswith(prefix)]
        start = inside[0] if inside else 0
    own_buffers = full["buffers"][:start] + full["buffers"][start + len(base_names):]
    out = {"architecture": full["architecture"], "base": base_full["architecture"], "base_path": at}
    if full["covers"]:
        out["covers"] = full["covers"]
    for k in INHERITED:
        if full[k] != base_full[k]:
            out[k] = full[k]
    out["base_model_prefix"] = full["base_model_prefix"]
    own_defaults = {k: v for k, v in full["defaults"].items() if base_full["defaults"].get(k, object()) != v}
    if own_defaults:
        out["defaults"] = own_defaults
    out["tied"] = full["tied"]
    out["modules"] = modules
    base_repeats = {prefix + p: e for p, e in base_full["repeats"].items()}
    own_repeats = {p: e for p, e in full["repeats"].items() if base_repeats.get(p) != e}
    if own_repeats:
        out["repeats"] = own_repeats
    if own_buffers:
        out["buffers"] = full["buffers"][:start] + [{"base": True}] + full["buffers"][start + len(base_names):]
    order = ["architecture", "covers", "base", "base_path"] + ENTRY_KEYS[2:]
    return {k: out[k] for k in order if k in out}


def share(fulls):
    """Format-2 entries for the full entries {name: entry}: each class whose modules hold another
    catalogued class (its base model, normally at base_model_prefix) whose entry, spliced in, gives
    back exactly the class's own extraction refers to that entry. The largest such base wins; a
    class used as a base keeps no base of its own (one level)."""
    chosen = {}
    for name, full in fulls.items():
        options = []
        for m in full["modules"]:
            at, cls = m["path"], m["class"]
            if not at or "{" in at or cls == name or cls not in fulls:
                continue
            entry = shared_entry(full, fulls[cls], at)
            if entry is None:
                continue
            if normalized(full) != expand(entry, {cls: compact_entry(fulls[cls])}):
                continue
            run = subtree_run(full["modules"], at)
            options.append((-(run[1] - run[0]), at != full["base_model_prefix"], at, entry))
        if options:
            chosen[name] = min(options, key=lambda o: o[:3])[3]
    used = {e["base"] for e in chosen.values()}
    out = {}
    for name, full in fulls.items():
        out[name] = chosen[name] if name in chosen and name not in used else compact_entry(full)
    return out


def verify(entries, fulls):
    """Asserts that every entry expands to its class's full extraction."""
    by_name = {e["architecture"]: e for e in entries}
    for e in entries:
        want = normalized(fulls[e["architecture"]])
        got = expand(e, by_name)
        assert got == want, f"{e['architecture']}: the format-2 entry does not expand to its own extraction: " + \
            ", ".join(k for k in ENTRY_KEYS if got[k] != want[k])


def compare_with_format1(fulls, path=FORMAT1_PATH):
    """[(class, differing fields)] between the committed entries (format 1, or format 2 expanded)
    of the hand-picked classes and the new full ones."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        old = json.load(f)
    by_name = {e["architecture"]: e for e in old["architectures"]}
    picked = {a for a, _, _ in ARCHITECTURES}
    out = []
    for e in old["architectures"]:
        name = e["architecture"]
        if name not in picked:
            continue
        if old.get("format", 1) == 2:
            e = expand(e, by_name)
        if name not in fulls:
            out.append((name, ["not built"]))
            continue
        a, b = normalized(e), normalized(fulls[name])
        diff = [k for k in ENTRY_KEYS if a[k] != b[k]]
        if diff:
            out.append((name, diff))
    return out


# ---------------------------------------------------------------------------------------------

def optional_names(expr):
    """The names an expression reads left of `??` (a ?? b: b when a is absent or null)."""
    tokens = catalog_expr.tokens(expr)
    return {t for t, nxt in zip(tokens, tokens[1:]) if (t[0].isalpha() or t[0] == "_") and nxt == "??"}


def fill_missing_defaults(entries, transformers):
    """Adds to an entry's "defaults" the config-class default of every config name one of its
    expressions (its own, or its base's) reads and neither its defaults nor its attribute map give,
    so that a config.json without that key evaluates as transformers' config class would (a name
    that is a property, such as num_feat_extract_layers, is never in config.json at all).
    Returns how many values were added."""
    by_name = {e["architecture"]: e for e in entries}
    added = 0
    for e in entries:
        base = by_name.get(e.get("base", ""), {})
        exprs = [x for b in e.get("buffers", []) + base.get("buffers", []) if "shape" in b for x in b["shape"]]
        exprs += list(e.get("repeats", {}).values()) + list(base.get("repeats", {}).values())
        known = dict(base.get("defaults", {}), **e.get("defaults", {}))
        amap = e.get("attribute_map", base.get("attribute_map", {}))
        # A name left of `??` is optional: its absence selects the alternative, so it gets no default.
        wanted = sorted({n for x in exprs for n in names_in(x)} - {n for x in exprs for n in optional_names(x)} - set(known) -
                        set(amap))
        if not wanted:
            continue
        config_class = e.get("config_class") or base.get("config_class")
        cls = getattr(transformers, config_class, None)
        if cls is None:
            continue
        try:
            config = cls()
        except Exception:  # noqa: BLE001 (a config that cannot be defaulted gives nothing)
            continue
        for name in wanted:
            value = config
            for part in name.split("."):
                value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
                if value is None:
                    break
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                e.setdefault("defaults", {})[name] = value
                added += 1
    return added


def catalog_document(transformers_version, torch_version, mappings, entries, skipped):
    return {
        "format": 2,
        "generator": "tests/compat/gen_catalog.py",
        "transformers": transformers_version,
        "torch": torch_version,
        "expression_syntax": "numbers, dotted config.json names, + - * // ( ) and a ?? b (b when a is absent or null)",
        "mappings": mappings,
        "architectures": sorted(entries, key=lambda e: e["architecture"]),
        "skipped": sorted(skipped, key=lambda s: s["architecture"]),
    }


def dumps_catalog(value, depth=0):
    """JSON text of the catalog, one line per entry field and per module, buffer, conversion,
    mapping and skipped class: diffs stay readable at little more than the compact size."""
    expand = isinstance(value, (dict, list)) and value and (
        depth <= 1 or (depth == 2 and (isinstance(value, list) or "modules" in value)) or
        (depth == 3 and isinstance(value, list) and isinstance(value[0], dict)))
    if not expand:
        return json.dumps(value, ensure_ascii=True)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps_catalog(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = [inner + dumps_catalog(v, depth + 1) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def read_cache(path):
    out = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    out[r["architecture"]] = r
    return out


def run_cached(classes, jobs, timeout_s, slow_build_s, cache_path, log, quiet=True, work=None, verb="build",
               failed="skipped"):
    """{class: result} for every class: from the cache (JSON lines at cache_path; None: none), and by
    build_all (work, describe unless given) for those it lacks, each result appended to it and logged
    as it comes."""
    results = {a: r for a, r in read_cache(cache_path).items() if a in classes}
    todo = [a for a in classes if a not in results]
    log(f"{len(classes)} classes, {len(results)} from the cache, {len(todo)} to {verb} with {jobs} workers")
    cache_file = open(cache_path, "a") if cache_path else None

    def on_result(r):
        results[r["architecture"]] = r
        status = "ok" if "entry" in r else f"{failed}: " + r["reason"]
        log(f"[{len(results)}/{len(classes)}] {r['architecture']} ({r['seconds']} s) {status}")
        for line in r["log"]:
            log(line)
        if cache_file:
            cache_file.write(json.dumps(r) + "\n")
            cache_file.flush()

    try:
        build_all(todo, jobs, timeout_s, slow_build_s, on_result, quiet=quiet, work=work)
    finally:
        if cache_file:
            cache_file.close()
    return results


def write_embedded(json_path=JSON_PATH, hpp_path=HPP_PATH):
    with open(json_path) as f:
        text = f.read()
    with open(hpp_path, "w") as f:
        f.write(embed_json.render_hpp(text, "catalog", "tests/compat/gen_catalog.py",
                                      os.path.relpath(json_path, ROOT),
                                      "The architecture catalog as string pieces, so reading it needs no file at run time.",
                                      index=("architectures", "architecture")))


def list_skipped(path=JSON_PATH):
    with open(path) as f:
        catalog = json.load(f)
    skipped = catalog.get("skipped", [])
    for s in skipped:
        print(f"{s['architecture']}: {s['reason']}")
    counts = collections.Counter(reason_category(s["reason"]) for s in skipped)
    total = len(catalog["architectures"]) + len(skipped)
    print(f"\n{len(catalog['architectures'])} of {total} mapped classes catalogued, {len(skipped)} skipped:")
    for category, n in counts.most_common():
        print(f"  {n:4d}  {category}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embed", action="store_true", help="only rewrite the .hpp from the committed JSON")
    ap.add_argument("--fill-defaults", action="store_true",
                    help="add missing config-class defaults to the committed JSON's entries (fast; needs transformers)")
    ap.add_argument("--list-skipped", action="store_true", help="print the committed catalog's skipped classes")
    ap.add_argument("--only", help="comma-separated classes to build and print in full (writes nothing)")
    ap.add_argument("--cache", help="JSON-lines file of per-class results, reused and extended")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds one class may take (default %(default)s)")
    ap.add_argument("--verbose", action="store_true", help="let the workers print (transformers' warnings)")
    args = ap.parse_args()
    if args.list_skipped:
        list_skipped()
        return
    if args.embed:
        write_embedded()
        return
    if args.fill_defaults:
        import transformers
        with open(JSON_PATH) as f:
            catalog = json.load(f)
        print(f"{fill_missing_defaults(catalog['architectures'], transformers)} defaults added", file=sys.stderr)
        with open(JSON_PATH, "w") as f:
            f.write(dumps_catalog(catalog) + "\n")
        write_embedded()
        return

    import torch
    import transformers
    from transformers.models.auto import modeling_auto
    transformers.logging.set_verbosity_error()
    # Imported once here, before the workers fork, rather than in each of them.
    import transformers.conversion_mapping  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    started = time.monotonic()
    mappings = mapped_classes(modeling_auto)
    classes = sorted({c for names in mappings.values() for c in names})
    if args.only is not None:
        classes = [c.strip() for c in args.only.split(",") if c.strip()]
    results = run_cached(classes, args.jobs, args.timeout, SLOW_BUILD_S, args.cache if args.only is None else None, log,
                         quiet=not args.verbose)
    for a in SKIP_ON_PURPOSE:
        if a in results:
            results[a] = {"architecture": a, "reason": SKIP_ON_PURPOSE[a]}
    fulls = {a: results[a]["entry"] for a in classes if "entry" in results[a]}
    covers = {a: text for a, text, _ in ARCHITECTURES}
    for a, full in fulls.items():  # the hand-written texts, also over results cached before one changed
        full["covers"] = covers.get(a, "")
    skipped = [{"architecture": a, "reason": results[a]["reason"]} for a in classes if "entry" not in results[a]]
    differences = compare_with_format1(fulls)
    if args.only is not None:
        print(json.dumps({"architectures": [fulls[a] for a in classes if a in fulls], "skipped": skipped}, indent=1))
        for name, fields in differences:
            if name in fulls:
                log(f"{name}: differs from the committed format-1 entry in {', '.join(fields)}")
        return

    entries = list(share(fulls).values())
    verify(entries, fulls)
    for name, fields in differences:
        log(f"{name}: differs from the committed format-1 entry in {', '.join(fields)}")
    assert not differences, "the hand-picked classes must come out as committed in catalog.json"
    log(f"{fill_missing_defaults(entries, transformers)} config-class defaults added for names expressions read")
    catalog = catalog_document(transformers.__version__, torch.__version__.split("+")[0], mappings, entries, skipped)
    listed = {c for names in mappings.values() for c in names}
    assert listed == {e["architecture"] for e in entries} | {s["architecture"] for s in skipped}
    os.makedirs(os.path.dirname(JSON_PATH), exist_ok=True)
    with open(JSON_PATH, "w") as f:
        f.write(dumps_catalog(catalog) + "\n")
    write_embedded()
    counts = collections.Counter(reason_category(s["reason"]) for s in skipped)
    log(f"{len(entries)} of {len(classes)} classes catalogued ({sum(1 for e in entries if 'base' in e)} sharing a base), "
        f"{len(skipped)} skipped: " + ", ".join(f"{n} {c}" for c, n in counts.most_common()))
    log(f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
