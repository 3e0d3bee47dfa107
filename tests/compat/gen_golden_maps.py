#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Records the device maps transformers' own from_pretrained(path, device_map=..., max_memory=...,
dtype=...) computes for a few shrunken architectures, as fixtures accel's planner is compared with.

For each architecture: a small config is saved as config.json next to a headers-only
model.safetensors (a sparse file: the header is real, the data section is a hole), written the
way save_pretrained writes a Hub folder: tied copies left out, transformers' renames and expert
fusions reverted (the names users download, not the model's in-memory names). from_pretrained then runs for real
until the device map is computed; the map is taken from transformers' _get_device_map and the
load is stopped there, before any weight would be read (this machine has no GPU; integer
budget keys are only names to the planner).

Each fixture tests/compat/fixtures/golden_maps/<architecture>.json (.json.gz past 1 MiB) holds the
versions, the config.json, the checkpoint's tensors (name, shape; each scenario gives their dtype), the model's state-dict keys
(`model_parameters`: what a device map given to from_pretrained must cover), the modules that hold
none of them (`model_bare_modules`: rotary embeddings, which map keys may name), the model name of
every checkpoint name transformers renames (`renamed`), and one entry per scenario: mode,
max_memory (bytes), dtype argument, and the map transformers returned (in model names).

  gen_golden_maps.py              regenerate the fixtures (needs torch + transformers + accelerate)
  gen_golden_maps.py --published  the same for every catalog architecture at its config class's
                                  defaults (the published base size), into fixtures/golden_maps_published,
                                  with PUBLISHED_SCENARIOS' budgets added where an architecture has some
  gen_golden_maps.py --published --only A,B   only these architectures' fixtures (the others untouched)
"""
import gzip
import json
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_names import loading_renamer, saved_state  # noqa: E402  (one copy of transformers' save/load renaming)
OUT = os.path.join(HERE, "fixtures", "golden_maps")
OUT_PUBLISHED = os.path.join(HERE, "fixtures", "golden_maps_published")
CATALOG = os.path.join(os.path.dirname(os.path.dirname(HERE)), "include/accel/model/data/catalog.json")

# (architecture, config class, small config). Sizes are small but keep the structure: several
# blocks, embeddings larger than one block, so budgets can split anywhere.
MODELS = [
    ("LlamaForCausalLM", "LlamaConfig", dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
                                             num_attention_heads=4, num_key_value_heads=2)),
    ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=512, n_positions=128, n_embd=64, n_layer=6, n_head=4)),
    ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=6,
                                                 num_attention_heads=4, max_position_embeddings=128)),
    ("T5ForConditionalGeneration", "T5Config", dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=4,
                                                    num_decoder_layers=3, num_heads=4)),
    ("BartForConditionalGeneration", "BartConfig", dict(vocab_size=512, d_model=64, encoder_layers=3, decoder_layers=3,
                                                        encoder_attention_heads=4, decoder_attention_heads=4,
                                                        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)),
]

# (name, mode, budgets as fractions of the model's size at the load dtype, dtype argument,
# checkpoint dtype). "auto" as dtype loads in the checkpoint's dtype.
SCENARIOS = [
    ("two_gpus_auto_fp16", "auto", {0: 0.6, 1: 0.6, "cpu": 2.0}, "float16", "F32"),
    ("two_gpus_sequential_bf16", "sequential", {0: 0.45, 1: 0.45, "cpu": 2.0}, "bfloat16", "F32"),
    ("gpu_cpu_disk_sequential", "sequential", {0: 0.4, "cpu": 0.4}, "float16", "F16"),
    ("three_gpus_balanced_low_0", "balanced_low_0", {0: 1.0, 1: 1.0, 2: 1.0, "cpu": 2.0}, "auto", "BF16"),
    ("one_gpu_cpu_auto_fp32", "auto", {0: 0.5, "cpu": 0.8}, "float32", "F32"),
    ("four_gpus_balanced_fp32_upcast", "balanced", {0: 0.3, 1: 0.3, 2: 0.3, 3: 0.3, "cpu": 2.0}, "float32", "BF16"),
    ("gpu_cpu_disk_auto_bf16_downcast", "auto", {0: 0.3, "cpu": 0.3}, "bfloat16", "F32"),
]

# Published sizes only: budgets added for one architecture, where the fractions above happen to
# fall where a difference in counting cannot move a block. Same fields as SCENARIOS.
PUBLISHED_SCENARIOS = {
    # GPT-Neo 1.3B: every block holds a non-persistent bool causal mask, 1 x 1 x 2048 x 2048 (4 MiB),
    # that no checkpoint stores; transformers counts it in the block (104,890,368 bytes in float16
    # rather than 100,696,064) and in the largest-layer reserve kept on GPU 0 once the embedding is
    # placed. Each budget is mid-way between the fills with and without it: GPU 0 room for 6 blocks
    # (not 7) plus a reserve, GPU 1 for 9 blocks; then GPU 0 as before and GPU 1 for 19 (not 20).
    "GPTNeoForCausalLM": [
        ("two_gpus_cpu_auto_fp16_block_reserve", "auto", {0: 0.394, 1: 0.3706, "cpu": 2.0}, "float16", "F32"),
        ("two_gpus_cpu_auto_fp16_block_fill", "auto", {0: 0.2182, 1: 0.7814, "cpu": 2.0}, "float16", "F32"),
    ],
}

TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
         "BOOL": 1}  # quantized checkpoints and non-float buffers too


class _Captured(Exception):
    pass


def write_headers_only(path, tensors):
    """A safetensors file whose header is real and whose data section is a hole."""
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        n = tensor_bytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.truncate(8 + len(blob) + offset)


def read_safetensors(path):
    """{name: (dtype, shape, data bytes)} of a safetensors file, in data order (the format: 8 bytes
    of header length, the JSON header, the data)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return {k: (v["dtype"], list(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in items}


def tensor_bytes(dtype, shape):
    n = SIZES[dtype]
    for d in shape:
        n *= d
    return n


def write_checkpoint_files(folder, tensors, shards=None, max_shard_bytes=4 << 30):
    """Headers-only checkpoint files as save_pretrained lays them out: one model.safetensors, or
    (past max_shard_bytes, or when `shards` is given) consecutive shards and their index. Shards
    also keep each file small enough for safetensors to map on a small machine. Returns the
    total data bytes."""
    total = sum(tensor_bytes(d, s) for _, d, s in tensors)
    if shards is None:
        shards = max(1, -(-total // max_shard_bytes))
    if shards == 1:
        write_headers_only(os.path.join(folder, "model.safetensors"), tensors)
        return total
    per = -(-len(tensors) // shards)
    weight_map = {}
    for i in range(shards):
        part = tensors[i * per:(i + 1) * per]
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        write_headers_only(os.path.join(folder, name), part)
        weight_map.update({n: name for n, _, _ in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return total


def build_meta(torch, transformers, arch, config):
    with torch.device("meta"):
        return getattr(transformers, arch)(config)


def checkpoint_tensors(torch, transformers, arch, config, dtype):
    """What save_pretrained writes, names and shapes: the state dict without tied copies, with
    transformers' load-time renames and expert fusions reverted (a Hub folder's names: `vit.encoder.layer.0`,
    `embed_out`, one tensor per expert)."""
    model = build_meta(torch, transformers, arch, config)
    return [(n, dtype, list(t.shape)) for n, t in saved_state(model).items()]


def model_names(torch, transformers, arch, config, names):
    """The model's state-dict keys (what from_pretrained's device map must cover) and the model
    name of every checkpoint name transformers renames (as from_pretrained renames it)."""
    model = build_meta(torch, transformers, arch, config)
    state = model.state_dict()
    model_name = loading_renamer(model)
    renamed = {}
    for n in names:
        if (m := model_name(n)) != n:
            renamed[n] = m
    # Modules that hold nothing in the state dict (rotary embeddings): device-map keys may name them.
    prefixes = {".".join(k.split(".")[:i]) for k in state for i in range(1, k.count(".") + 1)}
    bare = [n for n, _ in model.named_modules() if n and n not in prefixes]
    return list(state.keys()), bare, renamed


def record_map(transformers, arch, folder, mode, max_memory, dtype):
    import transformers.modeling_utils as mu
    original = mu._get_device_map
    captured = {}

    def capture(*args, **kwargs):
        captured["map"] = original(*args, **kwargs)
        raise _Captured()

    mu._get_device_map = capture
    try:
        getattr(transformers, arch).from_pretrained(folder, device_map=mode, max_memory=dict(max_memory), dtype=dtype)
    except _Captured:
        pass
    finally:
        mu._get_device_map = original
    return {k: v for k, v in captured["map"].items()}


def write_fixture(stem, fixture):
    """<stem>.json, or <stem>.json.gz (compact) past 1 MiB: a Hub-format MoE lists every expert's tensors."""
    for old in (stem + ".json", stem + ".json.gz"):
        if os.path.exists(old):
            os.remove(old)
    text = json.dumps(fixture, indent=1) + "\n"
    if len(text) <= 1 << 20:
        with open(stem + ".json", "w") as f:
            f.write(text)
        return
    # mtime=0: the same fixture gives the same bytes.
    with open(stem + ".json.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write((json.dumps(fixture, separators=(",", ":")) + "\n").encode())


def read_fixture(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def main():
    import accelerate
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    args = sys.argv[1:]
    published = "--published" in args
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args[:-1] else None
    out = OUT_PUBLISHED if published else OUT
    models = MODELS
    if published:  # every catalog architecture, its config class's defaults unchanged
        with open(CATALOG) as f:
            entries = {a["architecture"]: a for a in json.load(f)["architectures"]}
            # The hand-picked classes (those with a "covers" text); a head shares its base's config class.
            models = [(a["architecture"], a.get("config_class") or entries[a["base"]]["config_class"], {})
                      for a in entries.values() if a.get("covers")]
    if only is not None:
        if unknown := only - {m[0] for m in models}:
            sys.exit(f"--only: {sorted(unknown)} not among the architectures this run covers")
        models = [m for m in models if m[0] in only]
    os.makedirs(out, exist_ok=True)
    for arch, config_name, kwargs in models:
        config = getattr(transformers, config_name)(**kwargs)
        config.architectures = [arch]
        fixture = {
            "generator": "tests/compat/gen_golden_maps.py",
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
            "torch": torch.__version__.split("+")[0],
            "how": "from_pretrained(folder, device_map=mode, max_memory=max_memory, dtype=dtype), map taken from "
                   "transformers' _get_device_map before any weight is read",
            "architecture": arch,
            "config": json.loads(config.to_json_string()),
            "tensors": [],
            "maps": [],
        }
        names = [n for n, _, _ in checkpoint_tensors(torch, transformers, arch, config, "F32")]
        fixture["model_parameters"], fixture["model_bare_modules"], fixture["renamed"] = \
            model_names(torch, transformers, arch, config, names)
        for name, mode, fractions, dtype, stored in SCENARIOS + (PUBLISHED_SCENARIOS.get(arch, []) if published else []):
            tensors = checkpoint_tensors(torch, transformers, arch, config, stored)
            if not fixture["tensors"]:
                fixture["tensors"] = [[n, s] for n, _, s in tensors]
            load = stored if dtype == "auto" else {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtype]
            total = sum(tensor_bytes(load, shape) for _, _, shape in tensors)
            budgets = {k: int(total * f) for k, f in fractions.items()}
            with tempfile.TemporaryDirectory() as folder:
                config.save_pretrained(folder)
                write_checkpoint_files(folder, tensors)
                result = record_map(transformers, arch, folder, mode, budgets, dtype)
            fixture["maps"].append({"name": name, "device_map": mode, "dtype": dtype, "checkpoint_dtype": stored,
                                    "max_memory": {str(k): v for k, v in budgets.items()}, "result": result})
            print(f"{arch} {name}: {len(result)} entries", file=sys.stderr)
        write_fixture(os.path.join(out, arch), fixture)


if __name__ == "__main__":
    main()
