#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""accel's maps against real transformers on Hub-format folders: for every catalog architecture
and for vision-language and speech models outside it, a tiny model with random weights is written
by save_pretrained (the names a Hub folder holds: `vit.encoder.layer.0`, `embed_out`,
`language_model.model.…`, one tensor per expert), then:

1. `accel plan --json` (the model's names, the default) with a cpu budget of about half the
   model, so the map spreads over cpu and disk;
2. transformers' own from_pretrained map for the same budget (taken from its _get_device_map) is
   compared parameter by parameter (every key of the model's state dict): required to agree for
   catalog architectures, reported for the others (header heuristics, names from the name data);
3. from_pretrained(folder, device_map=<accel's map>) accepts it and puts every parameter where the
   map says (cpu, or offloaded to disk: the meta device);
4. `accel plan --names checkpoint` gives every tensor of the folder the device its model tensor got.

  hub_names_compat.py ACCEL_BINARY [ARCHITECTURE...]

Exits 77 (ctest: skipped) when torch or transformers cannot be imported (see torch_load_compat.py
for ACCEL_COMPAT_PYTHON). Prints one line per architecture and a summary; exits 1 on any difference
not listed in KNOWN_DIFFERENCES.
"""
import json
import os
import subprocess
import sys
import tempfile

SKIPPED = 77
HERE = os.path.dirname(os.path.abspath(__file__))
CATALOG = os.path.join(os.path.dirname(os.path.dirname(HERE)), "include/accel/model/data/catalog.json")
sys.path.insert(0, HERE)
from compare_golden_maps import device_of  # noqa: E402  (one rule for "where does this tensor go")
from gen_golden_maps import record_map  # noqa: E402  (transformers' own map, taken before any weight is read)

# Outside the catalog (header heuristics + the name data): multimodal and speech classes.
EXTRA = ["Qwen2AudioForConditionalGeneration", "VoxtralForConditionalGeneration", "Qwen2_5OmniThinkerForConditionalGeneration",
         "Blip2ForConditionalGeneration", "Kosmos2ForConditionalGeneration", "SiglipModel", "Wav2Vec2ForCTC"]

# (architecture) -> why accel's map differs from transformers' on purpose; every other difference fails.
KNOWN_DIFFERENCES = {}

# Config keys made small wherever a config (or a sub-config) has them.
SMALL = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 320, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128,
    "d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_decoder_layers": 2, "encoder_layers": 2,
    "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128, "num_heads": 4, "head_dim": 16, "moe_intermediate_size": 32, "num_local_experts": 4,
    "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 64,
    "max_position_embeddings": 256, "projection_dim": 32, "kv_lora_rank": 16, "q_lora_rank": 32,
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "ffn_dim": 128, "rotary_dim": 8, "rotary_emb_dim": 8, "n_group": 1, "topk_group": 1,
    "max_source_positions": 64, "max_target_positions": 64, "num_mel_bins": 16, "global_attn_every_n_layers": 2,
    "embed_dim": 64, "depth": 2, "out_hidden_size": 64, "local_attention": 16, "sliding_window": 32,
    "intermediate_size_mlp": 128,
}


def shrink(d):
    """The config dict with every known size key made small (sub-configs too)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and ("model_type" in v or k.endswith("_config")):
            out[k] = shrink(v)
        elif k in SMALL and isinstance(v, int) and not isinstance(v, bool):
            out[k] = min(v, SMALL[k]) if v else v
        else:
            out[k] = v
    # Token ids past the smaller vocabulary (Whisper's pad 50256) would index nothing.
    vocab = out.get("vocab_size")
    if isinstance(vocab, int):
        for k, v in list(out.items()):
            if k.endswith("token_id") and isinstance(v, int) and v >= vocab:
                out[k] = vocab - 1
            elif k.endswith("token_index") and isinstance(v, int) and v >= vocab:
                out[k] = vocab - 1
            elif k in ("suppress_tokens", "begin_suppress_tokens") and isinstance(v, list):
                out[k] = [t for t in v if t < vocab]
    if "layer_types" in out and isinstance(out["layer_types"], list) and "num_hidden_layers" in out:
        out["layer_types"] = out["layer_types"][:out["num_hidden_layers"]]
    if "mlp_layer_types" in out and isinstance(out["mlp_layer_types"], list) and "num_hidden_layers" in out:
        out["mlp_layer_types"] = out["mlp_layer_types"][:out["num_hidden_layers"]]
    # GPT-Neo: attention_types, [[pattern, times], ...], must expand to exactly num_layers; the
    # saved attention_layers is that expansion (left out: the config computes it again).
    if isinstance(out.get("attention_types"), list) and out["attention_types"] and isinstance(out.get("num_layers"), int):
        pattern = out["attention_types"][0][0]
        if out["num_layers"] % len(pattern) == 0:
            out["attention_types"] = [[pattern, out["num_layers"] // len(pattern)]]
            out.pop("attention_layers", None)
    return out


def tiny_model(torch, transformers, arch):
    cls = getattr(transformers, arch)
    base = cls.config_class().to_dict()
    config = cls.config_class.from_dict(shrink(base))
    config.architectures = [arch]
    torch.manual_seed(0)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return cls, model


def check(torch, transformers, accel, arch, work, in_catalog):
    """Failures for one architecture (empty: all agree), and a summary line."""
    from safetensors import safe_open
    cls, model = tiny_model(torch, transformers, arch)
    folder = os.path.join(work, arch)
    model.save_pretrained(folder)
    state = model.state_dict()
    total = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in state.values()}.values())
    budget = {"cpu": total * 6 // 10}
    files = [f for f in os.listdir(folder) if f.endswith(".safetensors")]
    stored = []
    for f in files:
        with safe_open(os.path.join(folder, f), "pt") as h:
            stored += list(h.keys())
    plan = [accel, "plan", "--checkpoint", folder, "--json", "--dtype", "float32", "--max-memory", json.dumps(budget)]
    run = subprocess.run(plan, capture_output=True, text=True)
    if run.returncode != 0:
        return [f"accel plan failed ({run.returncode}): {run.stderr.strip()}"], ""
    ours = json.loads(run.stdout)
    failures = []
    theirs = record_map(transformers, arch, folder, "auto", budget, "float32")
    differ = [k for k in state if device_of(k, ours) != device_of(k, theirs)]
    if differ and in_catalog and arch not in KNOWN_DIFFERENCES:
        failures.append(f"{len(differ)} of {len(state)} parameters placed elsewhere than transformers places them, "
                        f"e.g. {[(k, device_of(k, ours), device_of(k, theirs)) for k in differ[:3]]}")
    # from_pretrained accepts the map and follows it.
    try:
        loaded = cls.from_pretrained(folder, device_map=ours, dtype="float32", use_kernels=False,
                                     offload_folder=os.path.join(work, arch + "-offload"))
    except Exception as e:  # noqa: BLE001
        failures.append(f"from_pretrained refuses accel's map: {type(e).__name__}: {str(e)[:300]}")
        loaded = None
    if loaded is not None:
        for name, p in loaded.named_parameters():
            want = "meta" if device_of(name, ours) == "disk" else "cpu"
            if p.device.type != want:
                failures.append(f"from_pretrained put {name} on {p.device} where accel's map says {device_of(name, ours)}")
                break
        del loaded
    # The same plan in checkpoint names places the folder's tensors alike.
    run = subprocess.run(plan + ["--names", "checkpoint"], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"accel plan --names checkpoint failed: {run.stderr.strip()}")
    else:
        by_checkpoint = json.loads(run.stdout)
        uncovered = [n for n in stored if device_of(n, by_checkpoint) is None]
        if uncovered:
            failures.append(f"the checkpoint-name map covers no device for {uncovered[:3]}")
    devices = sorted({str(v) for v in ours.values()})
    return failures, f"{len(state)} parameters, {len(stored)} tensors in the folder, {len(ours)} map keys on {devices}, " \
                     f"{len(state) - len(differ)}/{len(state)} placed as transformers"


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    accel = os.path.abspath(sys.argv[1])
    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001
        other = os.environ.get("ACCEL_COMPAT_PYTHON")
        if other and not os.environ.get("ACCEL_COMPAT_PYTHON_TRIED"):
            os.environ["ACCEL_COMPAT_PYTHON_TRIED"] = "1"
            os.execv(other, [other, os.path.abspath(__file__), *sys.argv[1:]])
        print(f"test skipped: torch and transformers are not importable by {sys.executable} ({type(e).__name__}: {e})")
        return SKIPPED
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with open(CATALOG) as f:
        catalog = [a["architecture"] for a in json.load(f)["architectures"] if a.get("covers")]  # the hand-picked ones
    archs = catalog + EXTRA
    if len(sys.argv) > 2:
        archs = sys.argv[2:]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    failed = agreed = 0
    with tempfile.TemporaryDirectory(prefix="accel-hub-names-") as work:
        for arch in archs:
            try:
                failures, line = check(torch, transformers, accel, arch, work, arch in catalog)
            except Exception as e:  # noqa: BLE001  (a config the shrinking breaks: say so, count it)
                failures, line = [f"could not build a tiny model: {type(e).__name__}: {str(e)[:200]}"], ""
            known = KNOWN_DIFFERENCES.get(arch)
            status = "ok" if not failures else "FAILED"
            print(f"{arch}: {status} {line}" + (f" (known difference: {known})" if known else ""))
            for f in failures:
                print(f"    {f}")
            failed += bool(failures)
            agreed += not failures
    print(f"{agreed} of {len(archs)} architectures pass: accel's map accepted by from_pretrained, and placed as "
          f"transformers places it ({sum(a in catalog for a in archs)} in the catalog: required; the others use "
          f"header heuristics: reported)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
