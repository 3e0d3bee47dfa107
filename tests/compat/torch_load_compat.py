#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""accel against real torch + transformers on tiny models with random weights (a Llama, a Llama
with tied embeddings, a T5, whose `wo` transformers keeps in float32 when loading in float16),
each saved in float32 by save_pretrained (safetensors), in two scenarios: loaded as float16, and
loaded with dtype auto where config.json says bfloat16. For each:

1. `accel plan --json` with a cpu budget of about half the model, so the map spreads over cpu
   and disk;
2. transformers' from_pretrained(path, device_map=<that map>, dtype=...) accepts it and puts each
   parameter where the map says (cpu, or offloaded to disk);
3. `accel load` with that map (cpu and disk) reports no unexplained map key, and its
   `--dump-dir` output equals, tensor by tensor (names, dtype, shape, bytes), the state dict of
   from_pretrained(path, device_map="cpu", dtype=...); the converted tensors also equal torch's
   own `.to(dtype)` of the saved weights.

  torch_load_compat.py ACCEL_BINARY

Exits 77 (ctest: skipped) after printing why when torch or transformers cannot be imported;
ACCEL_COMPAT_PYTHON (CMake option or environment variable) names a Python that has them.
"""
import json
import os
import subprocess
import sys
import tempfile

SKIPPED = 77


def import_torch_stack():
    """(torch, transformers) or the reason they cannot be imported."""
    try:
        import torch
        import transformers
        return (torch, transformers), None
    except Exception as e:  # ImportError, or a broken install failing otherwise
        return None, f"{type(e).__name__}: {e}"


def accel_json(accel, *args):
    out = subprocess.run([accel, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def read_dump(torch, folder):
    """`accel load --dump-dir` output (accelerate's offload-folder format): name -> tensor."""
    with open(os.path.join(folder, "index.json")) as f:
        index = json.load(f)
    tensors = {}
    for name, entry in index.items():
        with open(os.path.join(folder, name + ".dat"), "rb") as f:
            data = bytearray(f.read())
        dtype = getattr(torch, entry["dtype"])
        t = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(entry["shape"])
    return tensors


def same_bytes(torch, a, b):
    """Bit-identical (NaN-safe): same dtype, shape and bytes."""
    return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def tiny_models(transformers):
    """name -> (model class, config): small enough to save and load in a second."""
    llama = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    return {
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig(**llama, tie_word_embeddings=False)),
        "llama-tied": (transformers.LlamaForCausalLM, transformers.LlamaConfig(**llama, tie_word_embeddings=True)),
        "t5": (transformers.T5ForConditionalGeneration,
               transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                     num_heads=4)),
    }


def check_scenario(torch, transformers, accel, label, model_class, path, stored, load_dtype, dtype_args, work, failures):
    """Plan, let transformers accept the map, load with accel and compare with torch."""
    def fail(msg):
        failures.append(f"{label}: {msg}")

    # 1. A map over cpu and disk: a cpu budget of half the model at the loaded dtype.
    # use_kernels=False: transformers 5 turns Hub kernels on by default and then requires the
    # `kernels` package; nothing here needs them.
    reference = model_class.from_pretrained(path, device_map="cpu", dtype=load_dtype, use_kernels=False).state_dict()
    total = sum(t.numel() * t.element_size() for t in {id(t): t for t in reference.values()}.values())
    map_path = os.path.join(work, "map.json")
    device_map = accel_json(accel, "plan", "--checkpoint", path, "--max-memory", f"cpu={total // 2}", "--json", *dtype_args)
    with open(map_path, "w") as f:
        json.dump(device_map, f)
    if set(device_map.values()) != {"cpu", "disk"}:
        fail(f"the plan does not spread over cpu and disk: {device_map}")

    # 2. transformers accepts the map and follows it.
    model = model_class.from_pretrained(path, device_map=device_map, dtype=load_dtype, use_kernels=False,
                                        offload_folder=os.path.join(work, "hf-offload"))
    if getattr(model, "hf_device_map", None) != device_map:
        fail(f"from_pretrained kept a different map: {getattr(model, 'hf_device_map', None)}")

    def placed(name):
        key = max((k for k in device_map if k == "" or name == k or name.startswith(k + ".")), key=len, default=None)
        return device_map.get(key)

    for name, p in model.named_parameters():
        want = "meta" if placed(name) == "disk" else "cpu"  # offloaded weights wait on the meta device
        if p.device.type != want:
            fail(f"from_pretrained put {name} on {p.device} where the map says {placed(name)}")
    del model

    # 3. accel load with the same map, every tensor dumped as loaded.
    dump = os.path.join(work, "dump")
    report = accel_json(accel, "load", "--checkpoint", path, "--device-map", map_path, "--offload-folder",
                        os.path.join(work, "accel-offload"), "--dump-dir", dump, "--json", *dtype_args)
    if report["unused_device_map_keys"] or report["unexpected"] or report["missing"]:
        fail(f"accel load left keys or tensors unexplained: unused keys {report['unused_device_map_keys']}, "
             f"unexpected {report['unexpected']}, missing {report['missing']}")
    loaded = read_dump(torch, dump)
    if set(loaded) != set(stored):
        fail(f"accel loaded {sorted(set(loaded) ^ set(stored))} differently from the checkpoint's tensors")
    converted = 0
    for name, t in loaded.items():
        ref = reference.get(name)
        if ref is None:
            fail(f"{name}: not in torch's state dict")
        elif not same_bytes(torch, t, ref):
            fail(f"{name}: accel loaded {t.dtype} {tuple(t.shape)}, torch {ref.dtype} {tuple(ref.shape)}"
                 + ("" if t.dtype != ref.dtype or t.shape != ref.shape else ", the bytes differ"))
        elif stored[name].dtype != t.dtype:
            converted += 1
            if not same_bytes(torch, t, stored[name].to(t.dtype)):
                fail(f"{name}: differs from torch's .to({t.dtype}) of the saved weights")
    return converted


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    accel = os.path.abspath(sys.argv[1])
    stack, why = import_torch_stack()
    if stack is None:
        other = os.environ.get("ACCEL_COMPAT_PYTHON")
        if other and not os.environ.get("ACCEL_COMPAT_PYTHON_TRIED"):  # the Python named for these tests, once
            os.environ["ACCEL_COMPAT_PYTHON_TRIED"] = "1"
            os.execv(other, [other, os.path.abspath(__file__), accel])
        print(f"test skipped: torch and transformers are not importable by {sys.executable} ({why}); "
              "configure with -DACCEL_COMPAT_PYTHON=<python with torch and transformers> or set that variable")
        return SKIPPED
    torch, transformers = stack
    from safetensors.torch import load_file
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")

    failures, checked = [], 0
    with tempfile.TemporaryDirectory(prefix="accel-torch-compat-") as tmp:
        for name, (model_class, config) in tiny_models(transformers).items():
            torch.manual_seed(0)
            model = model_class(config)
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_()  # every tensor random, so each conversion is exercised
            # (label, folder, config.json dtype, from_pretrained dtype, accel arguments)
            scenarios = [("float32 on disk, --dtype float16", "f32", None, torch.float16, ["--dtype", "float16"]),
                         ("float32 on disk, config.json says bfloat16, dtype auto", "f32-auto-bf16", "bfloat16", "auto", [])]
            for label, folder, config_dtype, load_dtype, dtype_args in scenarios:
                path = os.path.join(tmp, f"{name}-{folder}")
                model.save_pretrained(path)
                if config_dtype:  # as some Hub checkpoints: saved in float32, meant to run in bfloat16
                    with open(os.path.join(path, "config.json")) as f:
                        cfg = json.load(f)
                    cfg["dtype"] = config_dtype
                    with open(os.path.join(path, "config.json"), "w") as f:
                        json.dump(cfg, f)
                stored = load_file(os.path.join(path, "model.safetensors"))
                work = tempfile.mkdtemp(dir=tmp)
                before = len(failures)
                converted = check_scenario(torch, transformers, accel, f"{name}, {label}", model_class, path, stored,
                                           load_dtype, dtype_args, work, failures)
                checked += len(stored)
                status = "ok" if len(failures) == before else "FAILED"
                print(f"{name}, {label}: {len(stored)} tensors ({converted} converted) {status}")
    for f in failures[:40]:
        print("FAIL", f)
    if len(failures) > 40:
        print(f"... and {len(failures) - 40} more")
    print(f"{checked} tensors compared, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
