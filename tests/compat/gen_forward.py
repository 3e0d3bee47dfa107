#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes the forward-pass fixture: a tiny Llama (random weights) in Hub format, and transformers'
logits and greedy tokens for a fixed prompt of token ids, which examples/llama_generate.cpp must
reproduce over accel's placement.

The checkpoint is what users download: save_pretrained's bfloat16 shards with an index and
config.json. transformers runs it in float32 (the bfloat16 weights upcast exactly), eager attention,
with its KV cache, one token per step after the prompt; each step's last-position logits are kept.
The weights are drawn with a wide initializer so that every greedy choice wins by a clear margin
(the script checks it), so a correct float32 implementation cannot pick another token.

usage: gen_forward.py [OUT_DIR]   (default tests/compat/fixtures/forward/llama)
needs torch and transformers (tests/compat/README.md)
"""
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = [1, 17, 254, 3, 99, 480, 12, 7]
NEW_TOKENS = 8
SEED = 20261204
MIN_MARGIN = 1e-3  # top-1 minus top-2 logit at every step


def build_config():
    return LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.08,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)


def greedy(model):
    """Last-position float32 logits per step and the greedy tokens, with transformers' KV cache."""
    ids = torch.tensor([PROMPT])
    logits, tokens, margins = [], [], []
    cache = None
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            out = model(input_ids=ids, cache=cache, use_cache=True)
            cache = out.cache
            last = out.logits[0, -1].float()
            top = torch.topk(last, 2)
            margins.append(float(top.values[0] - top.values[1]))
            token = int(top.indices[0])
            logits.append([float(f"{v:.9g}") for v in last.tolist()])
            tokens.append(token)
            ids = torch.tensor([[token]])
    return logits, tokens, margins


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "fixtures", "forward", "llama")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(build_config()).to(torch.bfloat16)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out, max_shard_size="800KB")  # two shards and an index, as the Hub serves
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    loaded = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                              use_kernels=False)
    loaded.eval()
    logits, tokens, margins = greedy(loaded)
    if min(margins) < MIN_MARGIN:
        raise SystemExit(f"greedy margins {margins} fall below {MIN_MARGIN}: pick another SEED")
    golden = {
        "generator": "tests/compat/gen_forward.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "model": "LlamaForCausalLM, random weights (seed %d), bfloat16 on disk, run in float32, eager attention" % SEED,
        "prompt": PROMPT,
        "new_tokens": NEW_TOKENS,
        "tokens": tokens,
        "min_top2_margin": min(margins),
        "logits": logits,
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(f"wrote {out}: {len(os.listdir(out))} files, {size} bytes; tokens {tokens}; min margin {min(margins):.4f}")


if __name__ == "__main__":
    main()
