#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes the model skeletons the planner benchmark (and its accelerate peer) plan:

  llama2_70b.json   Llama-2-70B shapes: 80 decoder layers, hidden 8192, GQA (8 KV heads), 723 tensors
  layers_1000.json  1000 decoder layers of a 1024-wide model, 9003 tensors
  moe_173k.json     60 MoE layers x 320 experts x 3 projections x (weight, weight_scale, input_scale),
                    about 173k tensors (the size of the transformers report of a 60 s device map)

usage: gen_skeletons.py OUT_DIR
"""
import json
import os
import sys


def llama(layers, hidden, inter, vocab, kv, dtype="float16", tie=False):
    mods = [{"name": "", "class": "LlamaForCausalLM"}, {"name": "model", "class": "LlamaModel"},
            {"name": "model.embed_tokens", "class": "Embedding"}, {"name": "model.layers", "class": "ModuleList"}]
    params = [{"name": "model.embed_tokens.weight", "shape": [vocab, hidden], "dtype": dtype}]
    buffers = []
    for i in range(layers):
        p = f"model.layers.{i}"
        mods += [{"name": p, "class": "LlamaDecoderLayer"}, {"name": p + ".self_attn", "class": "LlamaAttention"}]
        for proj, shape in (("q_proj", [hidden, hidden]), ("k_proj", [kv, hidden]), ("v_proj", [kv, hidden]),
                            ("o_proj", [hidden, hidden])):
            mods.append({"name": f"{p}.self_attn.{proj}", "class": "Linear"})
            params.append({"name": f"{p}.self_attn.{proj}.weight", "shape": shape, "dtype": dtype})
        mods.append({"name": p + ".mlp", "class": "LlamaMLP"})
        for proj, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]), ("down_proj", [hidden, inter])):
            mods.append({"name": f"{p}.mlp.{proj}", "class": "Linear"})
            params.append({"name": f"{p}.mlp.{proj}.weight", "shape": shape, "dtype": dtype})
        for norm in ("input_layernorm", "post_attention_layernorm"):
            mods.append({"name": f"{p}.{norm}", "class": "LlamaRMSNorm"})
            params.append({"name": f"{p}.{norm}.weight", "shape": [hidden], "dtype": dtype})
    mods += [{"name": "model.norm", "class": "LlamaRMSNorm"}, {"name": "model.rotary_emb", "class": "LlamaRotaryEmbedding"},
             {"name": "lm_head", "class": "Linear"}]
    params.append({"name": "model.norm.weight", "shape": [hidden], "dtype": dtype})
    buffers.append({"name": "model.rotary_emb.inv_freq", "shape": [64], "dtype": "float32", "persistent": False})
    head = {"name": "lm_head.weight", "shape": [vocab, hidden], "dtype": dtype}
    if tie:
        head["alias_of"] = "model.embed_tokens.weight"
    params.append(head)
    return {"modules": mods, "parameters": params, "buffers": buffers}


def moe(layers=60, experts=320, hidden=2048, inter=768, vocab=102400):
    mods = [{"name": "", "class": "MoeForCausalLM"}, {"name": "model", "class": "MoeModel"},
            {"name": "model.embed_tokens", "class": "Embedding"}, {"name": "model.layers", "class": "ModuleList"}]
    params = [{"name": "model.embed_tokens.weight", "shape": [vocab, hidden], "dtype": "bfloat16"}]
    for i in range(layers):
        p = f"model.layers.{i}"
        mods += [{"name": p, "class": "MoeDecoderLayer"}, {"name": p + ".self_attn", "class": "Attention"}]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mods.append({"name": f"{p}.self_attn.{proj}", "class": "Linear"})
            params.append({"name": f"{p}.self_attn.{proj}.weight", "shape": [hidden, hidden], "dtype": "bfloat16"})
        mods += [{"name": p + ".mlp", "class": "MoeBlock"}, {"name": p + ".mlp.gate", "class": "Linear"},
                 {"name": p + ".mlp.experts", "class": "ModuleList"}]
        params.append({"name": f"{p}.mlp.gate.weight", "shape": [experts, hidden], "dtype": "bfloat16"})
        for e in range(experts):
            q = f"{p}.mlp.experts.{e}"
            mods.append({"name": q, "class": "Expert"})
            for proj, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]), ("down_proj", [hidden, inter])):
                mods.append({"name": f"{q}.{proj}", "class": "FP8Linear"})
                params.append({"name": f"{q}.{proj}.weight", "shape": shape, "dtype": "float8_e4m3fn"})
                params.append({"name": f"{q}.{proj}.weight_scale", "shape": [1], "dtype": "float32"})
                params.append({"name": f"{q}.{proj}.input_scale", "shape": [1], "dtype": "float32"})
        for norm in ("input_layernorm", "post_attention_layernorm"):
            mods.append({"name": f"{p}.{norm}", "class": "RMSNorm"})
            params.append({"name": f"{p}.{norm}.weight", "shape": [hidden], "dtype": "bfloat16"})
    mods += [{"name": "model.norm", "class": "RMSNorm"}, {"name": "lm_head", "class": "Linear"}]
    params.append({"name": "model.norm.weight", "shape": [hidden], "dtype": "bfloat16"})
    params.append({"name": "lm_head.weight", "shape": [vocab, hidden], "dtype": "bfloat16"})
    return {"modules": mods, "parameters": params, "buffers": []}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    models = {
        "llama2_70b.json": llama(80, 8192, 28672, 32000, 1024),
        "layers_1000.json": llama(1000, 1024, 2816, 32000, 1024),
        "moe_173k.json": moe(),
    }
    for name, skel in models.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(skel, f, separators=(",", ":"))
        print(f"{name}: {len(skel['modules'])} modules, {len(skel['parameters']) + len(skel['buffers'])} tensors")


if __name__ == "__main__":
    main()
