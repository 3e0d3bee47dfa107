#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes the forward-pass fixture: a tiny Llama (random weights) in Hub format, and transformers'
logits and greedy tokens for fixed prompts of token ids, which examples/llama_generate.cpp must
reproduce over accel's placement, in one process or split between replicas.

The checkpoint is what users download: save_pretrained's bfloat16 shards with an index and
config.json. transformers runs it in float32 (the bfloat16 weights upcast exactly), eager attention,
with its KV cache, one token per step after the prompt; each step's last-position logits are kept
(to 7 significant digits: the check's tolerance is 1e-3 of the step's largest logit). Each prompt
runs on its own (batch of one, no padding). The weights are drawn with a wide initializer so that
every greedy choice wins by a clear margin (the script checks it for every prompt), so a correct
float32 implementation cannot pick another token.

golden.json: "new_tokens" (steps per prompt), "min_top2_margin" (over every prompt), and "prompts":
a list of {"prompt", "tokens", "min_top2_margin", "logits" ([step][vocabulary])}. The first prompt is
the 8-token one the README shows; the others have 1 to 40 tokens, so that replicas and pipeline
stages get unequal work.

usage: gen_forward.py [OUT_DIR]   (default tests/compat/fixtures/forward/llama)
needs torch and transformers (tests/compat/README.md)
"""
import json
import os
import random
import shutil
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

FIRST_PROMPT = [1, 17, 254, 3, 99, 480, 12, 7]
OTHER_LENGTHS = [1, 40, 3, 21, 2, 13, 5, 34]  # mixed, so a contiguous split gets unequal work
NEW_TOKENS = 8
SEED = 20261204
MIN_MARGIN = 1e-3  # top-1 minus top-2 logit at every step
VOCAB = 512


def build_config():
    return LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                       rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.08,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)


def prompts():
    """FIRST_PROMPT, then one prompt of each OTHER_LENGTHS, ids drawn from a seeded generator."""
    rng = random.Random(SEED)
    return [FIRST_PROMPT] + [[rng.randrange(VOCAB) for _ in range(n)] for n in OTHER_LENGTHS]


def greedy(model, prompt):
    """Last-position float32 logits per step and the greedy tokens, with transformers' KV cache."""
    ids = torch.tensor([prompt])
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
            logits.append([float(f"{v:.7g}") for v in last.tolist()])
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
    runs = []
    for i, prompt in enumerate(prompts()):
        logits, tokens, margins = greedy(loaded, prompt)
        if min(margins) < MIN_MARGIN:
            raise SystemExit(f"prompt {i}: greedy margins {margins} fall below {MIN_MARGIN}: pick another SEED")
        runs.append({"prompt": prompt, "tokens": tokens, "min_top2_margin": min(margins), "logits": logits})
    golden = {
        "generator": "tests/compat/gen_forward.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "model": "LlamaForCausalLM, random weights (seed %d), bfloat16 on disk, run in float32, eager attention" % SEED,
        "new_tokens": NEW_TOKENS,
        "min_top2_margin": min(r["min_top2_margin"] for r in runs),
        "prompts": runs,
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(f"wrote {out}: {len(os.listdir(out))} files, {size} bytes; {len(runs)} prompts of "
          f"{sorted(len(r['prompt']) for r in runs)} tokens; min margin {golden['min_top2_margin']:.4f}")


if __name__ == "__main__":
    main()
