#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes a small Llama-shaped checkpoint (about 4 MB, bfloat16, two safetensors shards, an index
and a config.json with tied word embeddings) for the README demo, by hand: no torch needed.

usage: make_demo_checkpoint.py OUT_DIR [--layers N] [--hidden H] [--vocab V]
"""
import argparse
import json
import os
import random
import struct


def tensors(layers, hidden, inter, vocab):
    """Tensor (name, shape) pairs in model order, as transformers' LlamaForCausalLM names them."""
    out = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((p + f"self_attn.{proj}.weight", [hidden, hidden]))
        out.append((p + "mlp.gate_proj.weight", [inter, hidden]))
        out.append((p + "mlp.up_proj.weight", [inter, hidden]))
        out.append((p + "mlp.down_proj.weight", [hidden, inter]))
        out.append((p + "input_layernorm.weight", [hidden]))
        out.append((p + "post_attention_layernorm.weight", [hidden]))
    out.append(("model.norm.weight", [hidden]))
    # lm_head.weight is tied to the embedding (config tie_word_embeddings) and not stored,
    # as safetensors exports of tied models do.
    return out


def write_safetensors(path, items, rng):
    """items: (name, shape) in order; writes bf16 data with offsets packed in that order."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in items:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (len(text) + 8) % 8) % 8)  # align the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode("utf-8"))
        for name, shape in items:
            n = 1
            for d in shape:
                n *= d
            # Small bf16 values: random mantissa bits, exponent near 2^-7, random sign.
            vals = bytearray()
            for _ in range(n):
                bits = 0x3C00 | rng.getrandbits(7) | (rng.getrandbits(1) << 15)
                vals += struct.pack("<H", bits)
            f.write(vals)
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=2048)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(20261202)
    items = tensors(args.layers, args.hidden, args.intermediate, args.vocab)
    half = len(items) // 2
    shards = [items[:half], items[half:]]
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(os.path.join(args.out_dir, name), shard, rng)
        for tensor, _ in shard:
            weight_map[tensor] = name
    with open(os.path.join(args.out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": args.hidden,
        "intermediate_size": args.intermediate, "num_hidden_layers": args.layers, "num_attention_heads": 4,
        "vocab_size": args.vocab, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {len(items)} tensors ({total} bytes) in {len(shards)} shards to {args.out_dir}")


if __name__ == "__main__":
    main()
