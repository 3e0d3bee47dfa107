#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes a small Llama-shaped checkpoint (about 4 MB, bfloat16, two safetensors shards, an index
and a config.json with tied word embeddings) for the README demo, by hand: no torch needed.

usage: make_demo_checkpoint.py OUT_DIR [--layers N] [--hidden H] [--intermediate I] [--vocab V] [--heads N]
                               [--kv-heads N] [--untied]
"""
import argparse
import json
import os
import random
import struct


# bfloat16 0x3C00 | mantissa | sign: the low byte keeps 7 random mantissa bits, the high byte the sign.
LOW_BYTE = bytes(b & 0x7F for b in range(256))
HIGH_BYTE = bytes(0x3C | (b & 0x80) for b in range(256))


def tensors(layers, hidden, inter, vocab, tied=True, kv_dim=None):
    """Tensor (name, shape) pairs in model order, as transformers' LlamaForCausalLM names them."""
    out = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            rows = kv_dim if kv_dim and proj in ("k_proj", "v_proj") else hidden
            out.append((p + f"self_attn.{proj}.weight", [rows, hidden]))
        out.append((p + "mlp.gate_proj.weight", [inter, hidden]))
        out.append((p + "mlp.up_proj.weight", [inter, hidden]))
        out.append((p + "mlp.down_proj.weight", [hidden, inter]))
        out.append((p + "input_layernorm.weight", [hidden]))
        out.append((p + "post_attention_layernorm.weight", [hidden]))
    out.append(("model.norm.weight", [hidden]))
    # A tied lm_head.weight is the embedding (config tie_word_embeddings) and not stored, as
    # safetensors exports of tied models do.
    if not tied:
        out.append(("lm_head.weight", [vocab, hidden]))
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
            vals = bytearray(2 * n)
            vals[0::2] = rng.randbytes(n).translate(LOW_BYTE)
            vals[1::2] = rng.randbytes(n).translate(HIGH_BYTE)
            f.write(vals)
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    ap.add_argument("--untied", action="store_true", help="store lm_head.weight (tie_word_embeddings false)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = random.Random(20261202)
    kv_heads = args.kv_heads or args.heads
    items = tensors(args.layers, args.hidden, args.intermediate, args.vocab, tied=not args.untied,
                    kv_dim=kv_heads * (args.hidden // args.heads))
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
        "intermediate_size": args.intermediate, "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": kv_heads, "vocab_size": args.vocab, "tie_word_embeddings": not args.untied,
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {len(items)} tensors ({total} bytes) in {len(shards)} shards to {args.out_dir}")


if __name__ == "__main__":
    main()
