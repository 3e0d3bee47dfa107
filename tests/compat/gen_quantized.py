#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes tiny pre-quantized Hub checkpoints, one per quantization method, and the device maps
transformers' from_pretrained(folder, device_map=..., max_memory=..., dtype=...) computes for them,
as fixtures accel's planner is compared with.

Each case is a folder tests/compat/fixtures/quantized/<case>/ with
  config.json        the model config with its quantization_config as the method's Hub checkpoints carry it
  model.safetensors  a tiny checkpoint with real (seeded, deterministic) data in the method's on-disk
                     layout: tensor names as on the Hub (one tensor per expert for MoE), dtypes and shapes
                     as the method stores them. Made with the method's own library where it runs on a CPU
                     (compressed-tensors, gptqmodel, bitsandbytes through transformers, transformers' FP8
                     quantize op), else written by hand from the format's documentation (golden.json says which)
  golden.json        versions, the checkpoint's tensors (name, dtype, shape), the state dict of the model
                     transformers builds with the method's quantizer on the meta device, the bytes its
                     planner counts, one entry per scenario with the map transformers' _get_device_map
                     returned, and a real load of the checkpoint on this CPU (cpu_load_check: it checks
                     the layout against what transformers expects)

The maps: from_pretrained runs for real until the device map is computed, with CUDA faked
(torch.cuda.is_available, device_count 8, capability (9, 0), and the package probes a quantizer's
validate_environment makes) for that call only, as a GPU machine would run it; the model is built
on the meta device, the map is taken from transformers' _get_device_map and the load is stopped
there: no kernel runs and no weight is read. Budgets are fractions of the checkpoint's stored bytes.

  gen_quantized.py               regenerate every case (needs torch, transformers, accelerate,
                                 compressed-tensors, bitsandbytes, optimum, gptqmodel; ~15 s on 2 cores, a few
                                 minutes the first time, when gptqmodel compiles its JIT kernels)
  gen_quantized.py --only CASE   regenerate some cases
  gen_quantized.py --published   the headers of the published DeepSeek-V3 FP8 checkpoint (671B, with its
                                 MTP layer 61) and transformers' map for 8 GPUs of 141 GB, into
                                 fixtures/quantized_published/deepseek_v3_fp8.json.gz (~10 s)

Setting up (into the .venv-compat of README.md; --no-deps keeps the pinned torch and transformers, and
leaves out `kernels`, which transformers would then use in every from_pretrained):

  .venv-compat/bin/pip install --no-deps compressed-tensors==0.20.1 bitsandbytes==0.50.2 optimum==2.3.0 \
      gptqmodel==7.7.0 loguru device-smi pypcre tokenicer logbar defuser threadpoolctl protobuf dill pillow
  .venv-compat/bin/pip install requests
"""
import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_golden_maps  # noqa: E402
from gen_golden_maps import _Captured, write_checkpoint_files, write_fixture  # noqa: E402
from gen_names import saved_state  # noqa: E402  (the names save_pretrained writes)

OUT = os.path.join(HERE, "fixtures", "quantized")
OUT_PUBLISHED = os.path.join(HERE, "fixtures", "quantized_published")
SEED = 1234

# Bytes per element of every safetensors dtype these checkpoints use (the headers-only writer of
# gen_golden_maps sizes tensors with its SIZES table; the quantized dtypes are added to it).
STORED_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
gen_golden_maps.SIZES.update(STORED_SIZES)

HOW = ("from_pretrained(folder, device_map=mode, max_memory=max_memory, dtype=dtype) with CUDA availability "
       "faked (8 devices of capability 9.0, plus the package probes listed in `faked`) for the planning step "
       "only; the quantized model is built on the meta device and the map is taken from transformers' "
       "_get_device_map, where the load is stopped: no kernel runs, no weight is read")

# (name, mode, budgets as fractions of the checkpoint's stored bytes, dtype argument). The tiny
# models have five placement units (embeddings, two decoder layers of ~40% each, norm, lm_head), so
# the fractions are chosen for the splits they give: two GPUs and the CPU; three GPUs and the CPU;
# sequential over two GPUs, the CPU and the disk; balanced_low_0 over three GPUs; and a balanced map
# that fits on two GPUs (bitsandbytes refuses a map that puts quantized layers on the CPU or disk:
# for it the others record the error and the map infer_auto_device_map had computed).
SCENARIOS = [
    ("auto_two_gpus_cpu", "auto", {0: 0.7, 1: 0.7, "cpu": 0.55}, "auto"),
    ("auto_three_gpus_cpu_bf16", "auto", {0: 0.5, 1: 0.5, 2: 0.5, "cpu": 0.3}, "bfloat16"),
    ("sequential_two_gpus_cpu_disk_bf16", "sequential", {0: 0.6, 1: 0.6, "cpu": 0.5}, "bfloat16"),
    ("balanced_low_0_three_gpus", "balanced_low_0", {0: 1.0, 1: 0.6, 2: 0.6, "cpu": 1.0}, "auto"),
    ("balanced_two_gpus_fit_bf16", "balanced", {0: 1.2, 1: 1.2, "cpu": 1.0}, "bfloat16"),
]


# ----------------------------------------------------------------------------------------------
# small helpers


def version_of(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_name(dtype):
    return str(dtype).removeprefix("torch.")


def save_safetensors(path, tensors):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)


def seeded_model(cls, config, dtype):
    """A model with real weights: transformers' own initialisation under a fixed seed."""
    import torch
    torch.manual_seed(SEED)
    model = cls(config)
    return model.to(dtype).eval()


def copy_case_files(src, dst, config_edit=None):
    """config.json and the model file from a folder a library wrote; config_edit(dict) may adjust it."""
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    if config_edit:
        config_edit(config)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copyfile(os.path.join(src, "model.safetensors"), os.path.join(dst, "model.safetensors"))
    os.chmod(os.path.join(dst, "model.safetensors"), 0o644)


def write_config(folder, config, quantization_config):
    """config.json as save_pretrained writes it, with the checkpoint's quantization_config."""
    config.quantization_config = quantization_config
    config.save_pretrained(folder)
    del config.quantization_config


# ----------------------------------------------------------------------------------------------
# tiny architectures (Linear in/out features multiples of 128 where blocks or groups need it)


def llama_config(dtype):
    import transformers
    c = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                                 tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    c.architectures = ["LlamaForCausalLM"]
    c.dtype = dtype
    return c


def deepseek_config(**published):
    """DeepSeek-V3's shape in small: MLA with LoRA'd q and kv, one dense layer, then MoE with 4 routed
    experts and 1 shared. Block edges: kv_a_proj_with_mqa has 128 + 32 = 160 outputs (scale rows
    ceil(160/128) = 2, as the published 512 + 64 = 576 gives 5) and o_proj 2 * 32 = 64 inputs (one
    partial scale column)."""
    import transformers
    if published:
        c = transformers.DeepseekV3Config()
    else:
        c = transformers.DeepseekV3Config(
            vocab_size=64, hidden_size=128, intermediate_size=128, moe_intermediate_size=128, num_hidden_layers=2,
            first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
            topk_group=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=128, kv_lora_rank=128,
            qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, max_position_embeddings=256)
    c.architectures = ["DeepseekV3ForCausalLM"]
    c.dtype = "bfloat16"
    return c


def gpt_oss_config():
    import transformers
    c = transformers.GptOssConfig(vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=4,
                                  num_experts_per_tok=2, sliding_window=64, max_position_embeddings=256)
    c.architectures = ["GptOssForCausalLM"]
    c.dtype = "bfloat16"
    return c


@contextlib.contextmanager
def quiet(enabled=True):
    """gptqmodel prints banners, tables and progress bars on stdout and stderr."""
    if not enabled:
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        yield


def tiny_tokenizer(folder):
    """gptqmodel loads a tokenizer with the model: a word-level one over the tiny vocabulary."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t2", bos_token="t0",
                                         eos_token="t1", pad_token="t3").save_pretrained(folder)


# ----------------------------------------------------------------------------------------------
# block FP8 (DeepSeek-V3 / Qwen3-FP8 layout)

FP8_HUB_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def fp8_block_quantize(w, block=(128, 128)):
    """DeepSeek-V3's block FP8 (README_WEIGHTS.md): e4m3 weights, one F32 weight_scale_inv per 128x128
    block (amax / 448), partial blocks at the right and bottom edges ([ceil(out/128), ceil(in/128)]).
    The same arithmetic as transformers' Fp8Quantize, which only handles whole blocks."""
    import torch
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    out_f, in_f = w.shape
    bo, bi = block
    ro, ri = -(-out_f // bo), -(-in_f // bi)
    padded = torch.zeros(ro * bo, ri * bi, dtype=torch.float32)
    padded[:out_f, :in_f] = w.float()
    tiles = padded.reshape(ro, bo, ri, bi)
    amax = tiles.abs().amax(dim=(1, 3))
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    scale = torch.where(amax > 0, fp8_max / safe, torch.ones_like(amax))
    q = torch.clamp(tiles * scale[:, None, :, None], -fp8_max, fp8_max).to(torch.float8_e4m3fn)
    return q.reshape(ro * bo, ri * bi)[:out_f, :in_f].contiguous(), (1.0 / scale).float()


def is_fp8_linear_weight(name, tensor):
    """The tensors DeepSeek-V3 / fp8 checkpoints store in FP8: every projection of attention and MLP
    (experts included); embeddings, norms, the router (mlp.gate), lm_head and the MTP layer's eh_proj
    stay high precision."""
    return tensor.dim() == 2 and name.startswith("model.layers.") and not name.endswith(".eh_proj.weight") and \
        (name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight"))


def make_fp8_llama(folder):
    import torch
    import transformers
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    class _Quantizer:  # what Fp8Quantize reads of the quantizer
        quantization_config = transformers.FineGrainedFP8Config(weight_block_size=(128, 128))

    config = llama_config("bfloat16")
    model = seeded_model(transformers.LlamaForCausalLM, config, torch.bfloat16)
    op = Fp8Quantize(_Quantizer())
    out = {}
    for name, t in saved_state(model).items():
        if is_fp8_linear_weight(name, t):
            got = op.convert({name: t})
            mine, scale = fp8_block_quantize(t)
            assert torch.equal(got[name].view(torch.uint8), mine.view(torch.uint8)), name
            assert torch.equal(got[name.removesuffix("weight") + "weight_scale_inv"], scale), name
            out.update(got)
        else:
            out[name] = t
    save_safetensors(os.path.join(folder, "model.safetensors"), out)
    write_config(folder, config, dict(FP8_HUB_CONFIG))
    return ("library transformers " + transformers.__version__ + " (Fp8Quantize, the op FineGrainedFP8Config "
            "quantizes with on load; F32 weight_scale_inv per 128x128 block); quantization_config as "
            "Qwen3-*-FP8 and DeepSeek-V3 write it")


def deepseek_tensors(config, with_mtp, real):
    """name -> tensor (real: seeded bf16 data, FP8 quantized) or name -> (dtype, shape) (headers
    only) of a DeepSeek-V3 FP8 checkpoint as shipped: per-expert names, F8 projections with F32
    weight_scale_inv, the router's weight BF16 and its e_score_correction_bias F32, the rest BF16;
    with_mtp adds layer num_hidden_layers (the MTP module: a MoE decoder layer plus embed_tokens, enorm,
    hnorm, eh_proj, shared_head.norm, shared_head.head), as the published checkpoint has it."""
    import torch
    import transformers
    if real:
        model = seeded_model(transformers.DeepseekV3ForCausalLM, config, torch.bfloat16)
    else:
        with torch.device("meta"):
            model = transformers.DeepseekV3ForCausalLM(config).to(torch.bfloat16)
    state = saved_state(model)
    n = config.num_hidden_layers
    if with_mtp:
        last = f"model.layers.{n - 1}."
        h = config.hidden_size
        extra = {}
        for k, t in state.items():
            if k.startswith(last):
                extra[f"model.layers.{n}." + k[len(last):]] = t
        meta = lambda *shape: torch.empty(*shape, dtype=torch.bfloat16, device="meta")  # noqa: E731
        extra[f"model.layers.{n}.embed_tokens.weight"] = meta(config.vocab_size, h)
        extra[f"model.layers.{n}.enorm.weight"] = meta(h)
        extra[f"model.layers.{n}.hnorm.weight"] = meta(h)
        extra[f"model.layers.{n}.eh_proj.weight"] = meta(h, 2 * h)
        extra[f"model.layers.{n}.shared_head.norm.weight"] = meta(h)
        extra[f"model.layers.{n}.shared_head.head.weight"] = meta(config.vocab_size, h)
        state.update(extra)
    out = {}
    for name, t in state.items():
        fp32 = name.endswith("e_score_correction_bias")
        if is_fp8_linear_weight(name, t):
            scale_shape = [-(-t.shape[0] // 128), -(-t.shape[1] // 128)]
            scale_name = name.removesuffix("weight") + "weight_scale_inv"
            if real:
                q, s = fp8_block_quantize(t)
                assert list(s.shape) == scale_shape
                out[name], out[scale_name] = q, s
            else:
                out[name] = ("F8_E4M3", list(t.shape))
                out[scale_name] = ("F32", scale_shape)
        elif real:
            out[name] = t.float() if fp32 else t.to(torch.bfloat16)
        else:
            out[name] = ("F32" if fp32 else "BF16", list(t.shape))
    return out


def make_fp8_deepseek(folder):
    config = deepseek_config()
    tensors = deepseek_tensors(config, with_mtp=False, real=True)
    save_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    write_config(folder, config, dict(FP8_HUB_CONFIG))
    return ("written by hand from DeepSeek-V3's README_WEIGHTS.md (F8_E4M3 projections, F32 weight_scale_inv "
            "[ceil(out/128), ceil(in/128)] = block amax / 448, partial blocks at the edges; one tensor per expert; "
            "router weight BF16, e_score_correction_bias F32), checked bit for bit against transformers' "
            "Fp8Quantize on whole blocks")


# ----------------------------------------------------------------------------------------------
# compressed-tensors (llm-compressor's save path)


def make_compressed_tensors(folder, preset):
    import compressed_tensors
    import torch
    import transformers
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus, apply_quantization_config,
                                                 preset_name_to_scheme)
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    config = llama_config("bfloat16")
    model = seeded_model(transformers.LlamaForCausalLM, config, torch.bfloat16)
    qc = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}, ignore=["lm_head"],
                            quantization_status=QuantizationStatus.INITIALIZED)
    apply_quantization_config(model, qc, show_progress=False)
    # Weight observers as llm-compressor's min-max observer computes them.
    for _, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        args = scheme.weights
        w = module.weight.data.float()
        if args.strategy == "channel":
            lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        elif args.strategy == "group":
            g = w.reshape(w.shape[0], -1, args.group_size)
            lo, hi = g.amin(dim=2), g.amax(dim=2)
        else:
            raise NotImplementedError(args.strategy)
        scale, zero_point = calculate_qparams(lo, hi, args)
        module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero_point.to(module.weight_zero_point.dtype))
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        compressor.update_config(tmp)
        copy_case_files(tmp, folder)
    return (f"library compressed-tensors {compressed_tensors.__version__} (apply_quantization_config with the "
            f"{preset} preset, min-max weight scales, ModelCompressor.compress_model, save_pretrained, update_config: "
            f"llm-compressor's save path)")


# ----------------------------------------------------------------------------------------------
# GPTQ and AWQ through gptqmodel's weight-only (RTN) path


def make_gptqmodel(folder, fmt):
    import torch
    import transformers
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # gptqmodel's default asks for more threads than 2 cores
    with quiet():
        from gptqmodel import GPTQModel
        from gptqmodel.quantization.config import RTNConfig

    config = llama_config("float16")
    model = seeded_model(transformers.LlamaForCausalLM, config, torch.float16)
    with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
        model.save_pretrained(src)
        tiny_tokenizer(src)
        sym = fmt == "gptq"  # AWQ checkpoints are asymmetric (zero_point true)
        with quiet():
            qmodel = GPTQModel.load(src, RTNConfig(bits=4, group_size=128, format=fmt, sym=sym), device="cpu",
                                    dtype=torch.float16)
            qmodel.quantize(None)
            qmodel.save(dst)

        def edit(c):
            if fmt == "gptq":  # gptqmodel's own config, less the temporary folder it names
                c["quantization_config"]["meta"]["offload_to_disk_path"] = None
            else:  # AutoAWQ's quantization_config (gptqmodel writes its own, quant_method gptq, format gemm)
                c["quantization_config"] = {"bits": 4, "group_size": 128, "modules_to_not_convert": None,
                                            "quant_method": "awq", "version": "gemm", "zero_point": True}
        copy_case_files(dst, folder, edit)
    v = version_of("gptqmodel")
    if fmt == "gptq":
        return (f"library gptqmodel {v} (RTNConfig weight-only quantization, format gptq: the v1 GPTQ checkpoint "
                f"layout, qzeros stored minus one), its quantization_config with meta.offload_to_disk_path cleared")
    return (f"library gptqmodel {v} (RTNConfig weight-only quantization, format gemm: AutoAWQ's GEMM packing); "
            f"quantization_config replaced by the one AutoAWQ writes")


# ----------------------------------------------------------------------------------------------
# MXFP4 (gpt-oss)

MXFP4_HUB_CONFIG = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                               "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def mxfp4_quantize(w):
    """OCP MX FP4 as gpt-oss stores it: w [..., out, in] -> blocks U8 [..., out, in/32, 16] (two e2m1
    codes per byte, the even element in the low nibble) and scales U8 [..., out, in/32] (E8M0: the
    power of two + 127)."""
    import torch
    *lead, out_f, in_f = w.shape
    g = w.float().reshape(*lead, out_f, in_f // 32, 32)
    amax = g.abs().amax(dim=-1)
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp(min=1e-30) / 6.0)), torch.zeros_like(amax))
    exp = exp.clamp(-127, 127)
    scaled = g / torch.pow(2.0, exp)[..., None]
    grid = torch.tensor(FP4_VALUES)
    mag = (scaled.abs()[..., None] - grid).abs().argmin(dim=-1)
    code = (mag | ((scaled < 0) & (mag > 0)).to(torch.int64) << 3).to(torch.uint8)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    return blocks.contiguous(), (exp + 127).to(torch.uint8).contiguous()


def make_mxfp4_gpt_oss(folder):
    import torch
    import transformers
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    config = gpt_oss_config()
    model = seeded_model(transformers.GptOssForCausalLM, config, torch.bfloat16)
    out = {}
    for name, t in saved_state(model).items():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            # The model holds [E, in, out]; the checkpoint [E, out, in/32, 16].
            blocks, scales = mxfp4_quantize(t.transpose(1, 2))
            back = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            assert back.shape == t.shape and (back - t.float()).abs().max() <= t.float().abs().max() / 4 + 1e-6, name
            out[name + "_blocks"], out[name + "_scales"] = blocks, scales
        else:
            out[name] = t
    save_safetensors(os.path.join(folder, "model.safetensors"), out)
    write_config(folder, config, {k: (list(v) if isinstance(v, list) else v) for k, v in MXFP4_HUB_CONFIG.items()})
    return ("written by hand from the OCP MX spec as openai/gpt-oss ships it (experts' gate_up_proj/down_proj as "
            "_blocks U8 [E, out, in/32, 16] and _scales U8 E8M0 [E, out, in/32], biases, router, attention, "
            "embeddings BF16), checked by dequantizing with transformers' convert_moe_packed_tensors")


# ----------------------------------------------------------------------------------------------
# bitsandbytes (quantized on the CPU by transformers + bitsandbytes, then save_pretrained)


def make_bnb(folder, bits):
    import bitsandbytes
    import torch
    import transformers
    config = llama_config("bfloat16")
    model = seeded_model(transformers.LlamaForCausalLM, config, torch.bfloat16)
    if bits == 4:  # unsloth's *-bnb-4bit: nf4 with double quantization, bf16 compute
        qc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                             bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    else:
        qc = transformers.BitsAndBytesConfig(load_in_8bit=True)
    with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
        model.save_pretrained(src)
        q = transformers.LlamaForCausalLM.from_pretrained(src, quantization_config=qc, device_map="cpu",
                                                          dtype=torch.bfloat16, use_kernels=False)
        q.save_pretrained(dst)
        copy_case_files(dst, folder)
    return (f"library bitsandbytes {bitsandbytes.__version__} through transformers {transformers.__version__} "
            f"(from_pretrained with BitsAndBytesConfig on the CPU, then save_pretrained)")


CASES = {
    "fp8_llama": ("fp8", "LlamaForCausalLM", make_fp8_llama),
    "fp8_deepseek_v3": ("fp8", "DeepseekV3ForCausalLM", make_fp8_deepseek),
    "ct_fp8_dynamic": ("compressed-tensors", "LlamaForCausalLM", lambda f: make_compressed_tensors(f, "FP8_DYNAMIC")),
    "ct_w4a16": ("compressed-tensors", "LlamaForCausalLM", lambda f: make_compressed_tensors(f, "W4A16")),
    "ct_w4a16_asym": ("compressed-tensors", "LlamaForCausalLM", lambda f: make_compressed_tensors(f, "W4A16_ASYM")),
    "gptq_4bit": ("gptq", "LlamaForCausalLM", lambda f: make_gptqmodel(f, "gptq")),
    "awq_gemm": ("awq", "LlamaForCausalLM", lambda f: make_gptqmodel(f, "gemm")),
    "mxfp4_gpt_oss": ("mxfp4", "GptOssForCausalLM", make_mxfp4_gpt_oss),
    "bnb_nf4": ("bitsandbytes", "LlamaForCausalLM", lambda f: make_bnb(f, 4)),
    "bnb_int8": ("bitsandbytes", "LlamaForCausalLM", lambda f: make_bnb(f, 8)),
}
PACKAGES = {"compressed-tensors": ["compressed-tensors"], "gptq": ["gptqmodel", "optimum"], "awq": ["gptqmodel"],
            "bitsandbytes": ["bitsandbytes"], "fp8": [], "mxfp4": ["triton"]}


# ----------------------------------------------------------------------------------------------
# transformers' map, with CUDA faked for the planning step


@contextlib.contextmanager
def patched(obj, name, value, log, label):
    """obj.name = value for the duration, `label` noted in `log`."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    log.append(label)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def fake_cuda(method):
    """What a machine with 8 GPUs of compute capability 9.0 and the method's packages shows
    transformers' quantizers, for one from_pretrained call. Returns the list of what was faked."""
    import torch
    faked = []
    with contextlib.ExitStack() as stack:
        enter = lambda obj, name, value, label: stack.enter_context(patched(obj, name, value, faked, label))  # noqa: E731
        enter(torch.cuda, "is_available", lambda: True, "torch.cuda.is_available() -> True")
        enter(torch.cuda, "device_count", lambda: 8, "torch.cuda.device_count() -> 8")
        enter(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0), "torch.cuda.get_device_capability() -> (9, 0)")
        enter(torch.cuda, "current_device", lambda: 0, "torch.cuda.current_device() -> 0")
        enter(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H200", "torch.cuda.get_device_name() -> 'NVIDIA H200'")
        enter(torch.cuda, "memory_reserved", lambda *a, **k: 0, "torch.cuda.memory_reserved() -> 0")
        enter(torch.cuda, "memory_allocated", lambda *a, **k: 0, "torch.cuda.memory_allocated() -> 0")
        if method == "mxfp4":
            # The gpt-oss triton kernels come from the Hub through the `kernels` package, which this
            # machine lacks (and could not download): without them transformers dequantizes to bf16.
            import transformers.integrations.hub_kernels as hub_kernels
            import transformers.quantizers.quantizer_mxfp4 as qm
            enter(qm, "is_kernels_available", lambda *a, **k: True, "quantizer_mxfp4.is_kernels_available() -> True")
            enter(qm, "is_triton_available", lambda *a, **k: True, "quantizer_mxfp4.is_triton_available() -> True")
            enter(hub_kernels, "get_kernel", lambda *a, **k: object(),
                  "hub_kernels.get_kernel('kernels-community/gpt-oss-triton-kernels') -> a stand-in object (never called)")
        yield faked


def capture_map(arch, folder, mode, max_memory, dtype, method):
    """transformers' map for one scenario, and what it planned over: {"result", "error",
    "max_memory_seen" (what infer_auto_device_map got, after get_balanced_memory and the quantizer's
    adjust_max_memory), "inferred" (infer_auto_device_map's map), "model" (the meta model), "quantizer",
    "faked"}."""
    import transformers
    import transformers.integrations.accelerate as tia
    import transformers.modeling_utils as mu
    original, original_infer = mu._get_device_map, tia.infer_auto_device_map
    got = {}

    def capture(model, device_map, max_memory_arg, hf_quantizer):
        got["model"], got["quantizer"] = model, hf_quantizer
        try:
            got["result"] = original(model, device_map, max_memory_arg, hf_quantizer)
        except Exception as e:  # noqa: BLE001  (a quantizer refusing the map it got)
            got["error"] = f"{type(e).__name__}: {e}"
        raise _Captured()

    def infer(model, max_memory=None, **kwargs):
        got["max_memory_seen"] = {str(k): v for k, v in (max_memory or {}).items()}
        got["inferred"] = original_infer(model, max_memory=max_memory, **kwargs)
        return got["inferred"]

    mu._get_device_map, tia.infer_auto_device_map = capture, infer
    try:
        with fake_cuda(method) as faked, quiet(method in ("gptq", "awq", "compressed-tensors")):
            got["faked"] = list(faked)
            try:
                getattr(transformers, arch).from_pretrained(folder, device_map=mode, max_memory=dict(max_memory),
                                                            dtype=dtype, use_kernels=False)
            except _Captured:
                pass
    finally:
        mu._get_device_map, tia.infer_auto_device_map = original, original_infer
    return got


def quantized_module_classes(model):
    """Class names of the modules that hold quantized (integer or float8) tensors."""
    import torch
    low = (torch.float8_e4m3fn, torch.float8_e5m2)
    out = set()
    for _, module in model.named_modules():
        for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            if not t.is_floating_point() or t.dtype in low:
                out.add(type(module).__name__)
    return sorted(out)


def model_state(model):
    return [[n, torch_name(t.dtype), list(t.shape)] for n, t in model.state_dict().items()]


def counted_bytes(model, hf_quantizer):
    """What transformers' planner counts (compute_module_sizes, parameters and buffers, tied copies
    once): the bytes of each parameter/buffer where they differ from numel * element size of the meta
    tensor, the whole model, and each module down to model.layers.N."""
    from transformers.integrations.accelerate import compute_module_sizes
    sizes, _ = compute_module_sizes(model, hf_quantizer, only_modules=False)
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    modules = {n for n, _ in model.named_modules() if n}
    differ = {}
    for name, t in tensors.items():
        if name in sizes and sizes[name] != t.numel() * t.element_size():
            differ[name] = sizes[name]
    per_module = {n: v for n, v in sizes.items() if n in modules and n.count(".") <= 2}
    return differ, sizes.get("", 0), per_module


def cpu_load_check(arch, folder, method):
    """The checkpoint's data loaded for real on this CPU (no fake): from_pretrained(folder,
    device_map="cpu") and one forward pass. Without a GPU transformers dequantizes fp8 and mxfp4 to
    bf16 while loading, so this also checks the scales against the weights."""
    import torch
    import transformers
    with quiet(method in ("gptq", "awq", "compressed-tensors")):
        try:
            model, info = getattr(transformers, arch).from_pretrained(
                folder, device_map="cpu", use_kernels=False, output_loading_info=True, ignore_mismatched_sizes=True)
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        out = {"how": "from_pretrained(folder, device_map='cpu', ignore_mismatched_sizes=True, output_loading_info=True) "
                      "on this CPU without any fake (fp8 and mxfp4 are dequantized to bf16 there), then one forward pass",
               "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
               "mismatched": sorted([k, list(a), list(b)] for k, a, b in info["mismatched_keys"]),
               "dtypes": sorted({torch_name(t.dtype) for t in model.state_dict().values()})}
        try:
            with torch.no_grad():
                out["forward_finite"] = bool(torch.isfinite(model(torch.tensor([[1, 2, 3, 4]])).logits.float()).all())
        except Exception as e:  # noqa: BLE001
            out["forward_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if out["mismatched"]:
        out["note"] = ("[name, checkpoint shape, model shape]; from_pretrained refuses the checkpoint unless "
                       "ignore_mismatched_sizes=True (then these tensors are reinitialised)")
    return out


def record_case(case, method, arch, folder, layout_source):
    import accelerate
    import torch
    import transformers
    entries = gen_golden_maps.read_safetensors(os.path.join(folder, "model.safetensors"))
    tensors = [[name, dtype, shape] for name, (dtype, shape, _) in entries.items()]
    stored = sum(len(data) for _, _, data in entries.values())
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    fixture = {
        "generator": "tests/compat/gen_quantized.py",
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "torch": torch.__version__.split("+")[0],
        "packages": {p: version_of(p) for p in PACKAGES[method]},
        "how": HOW,
        "case": case,
        "method": method,
        "architecture": arch,
        "layout_source": layout_source,
        "quantization_config": config.get("quantization_config"),
        "checkpoint_bytes": stored,
        "checkpoint_tensors": tensors,
    }
    maps = []
    for name, mode, fractions, dtype in SCENARIOS:
        budgets = {k: int(stored * f) for k, f in fractions.items()}
        got = capture_map(arch, folder, mode, budgets, dtype, method)
        if "model" not in got:
            fixture["maps"], fixture["no_maps_because"] = [], got.get("error", "from_pretrained stopped before the map")
            break
        model, quantizer = got["model"], got["quantizer"]
        if "model_parameters" not in fixture:
            fixture["faked"] = got["faked"]
            fixture["quantizer"] = type(quantizer).__name__ if quantizer is not None else None
            fixture["dequantized"] = bool(getattr(quantizer.quantization_config, "dequantize", False)) \
                if quantizer is not None else None
            fixture["quantized_module_classes"] = quantized_module_classes(model)
            fixture["model_parameters"] = model_state(model)
            differ, total, per_module = counted_bytes(model, quantizer)
            fixture["model_bytes_counted"] = total
            fixture["module_bytes_counted"] = per_module
            fixture["counted_bytes_differ"] = differ
        entry = {"name": name, "device_map": mode, "dtype": dtype,
                 "max_memory": {str(k): v for k, v in budgets.items()},
                 "model_dtype": torch_name(model.dtype)}
        # Parameters whose dtype differs from model_parameters (taken from the first scenario).
        first = {n: d for n, d, _ in fixture["model_parameters"]}
        changed = {n: torch_name(t.dtype) for n, t in model.state_dict().items() if first.get(n) != torch_name(t.dtype)}
        if changed:
            entry["model_parameters_dtype_changed"] = changed
        if "error" in got:
            entry["result"] = None
            entry["error"] = got["error"]
            entry["inferred_map"] = got.get("inferred")
        else:
            entry["result"] = dict(got["result"])
        entry["max_memory_seen"] = got.get("max_memory_seen")
        maps.append(entry)
        print(f"  {name}: {len(entry['result'] or {})} entries{' (' + entry['error'][:60] + ')' if 'error' in entry else ''}",
              file=sys.stderr)
    fixture.setdefault("maps", maps)
    fixture["cpu_load_check"] = cpu_load_check(arch, folder, method)
    with open(os.path.join(folder, "golden.json"), "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    return fixture


def generate(cases):
    import transformers
    transformers.logging.set_verbosity_error()
    for case in cases:
        method, arch, make = CASES[case]
        folder = os.path.join(OUT, case)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.makedirs(folder)
        print(f"{case}: writing", file=sys.stderr)
        layout_source = make(folder)
        for extra in os.listdir(folder):
            if extra not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(folder, extra))
        print(f"{case}: maps", file=sys.stderr)
        fixture = record_case(case, method, arch, folder, layout_source)
        dtypes = sorted({d for _, d, _ in fixture.get("model_parameters", [])})
        check = fixture["cpu_load_check"]
        check = check.get("error") or f"mismatched {len(check['mismatched'])}, missing {len(check['missing'])}, " \
            f"unexpected {len(check['unexpected'])}, forward {check.get('forward_finite', check.get('forward_error'))}"
        print(f"{case}: {fixture.get('quantizer')} dequantized={fixture.get('dequantized')} model dtypes {dtypes}; "
              f"cpu load: {check}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# --published: the real DeepSeek-V3 FP8 checkpoint's headers


def published():
    import accelerate
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    config = deepseek_config(published=True)
    tensors = deepseek_tensors(config, with_mtp=True, real=False)
    listing = [(n, d, s) for n, (d, s) in tensors.items()]
    mtp = f"model.layers.{config.num_hidden_layers}."
    budgets = {i: 141 * 10**9 for i in range(8)}
    budgets["cpu"] = 2 * 10**12
    with tempfile.TemporaryDirectory() as folder:
        write_config(folder, config, dict(FP8_HUB_CONFIG))
        with open(os.path.join(folder, "config.json")) as f:
            config_json = json.load(f)
        stored = write_checkpoint_files(folder, listing)
        got = capture_map("DeepseekV3ForCausalLM", folder, "auto", budgets, "auto", "fp8")
    model, quantizer = got["model"], got["quantizer"]
    differ, counted, per_module = counted_bytes(model, quantizer)
    size = lambda items: sum(gen_golden_maps.tensor_bytes(d, s) for _, d, s in items)  # noqa: E731
    fixture = {
        "generator": "tests/compat/gen_quantized.py --published",
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "torch": torch.__version__.split("+")[0],
        "how": HOW + "; the checkpoint is a headers-only sparse folder (shards of at most 4 GiB and their index)",
        "case": "deepseek_v3_fp8",
        "method": "fp8",
        "architecture": "DeepseekV3ForCausalLM",
        "layout_source": "headers written from DeepseekV3Config's defaults (the published config) as "
                         "deepseek-ai/DeepSeek-V3 ships them: per-expert names, F8_E4M3 projections with F32 "
                         "weight_scale_inv [ceil(out/128), ceil(in/128)], router weight BF16, "
                         "e_score_correction_bias F32, the rest BF16, and the MTP layer "
                         f"{mtp}* (eh_proj BF16 [h, 2h])",
        "config": config_json,
        "checkpoint_bytes": stored,
        "checkpoint_tensor_count": len(listing),
        "mtp_layer_bytes": size([t for t in listing if t[0].startswith(mtp)]),
        "mtp_layer_tensor_count": sum(1 for t in listing if t[0].startswith(mtp)),
        "mtp_note": "transformers' DeepseekV3 has no MTP module: _keys_to_ignore_on_load_unexpected = "
                    "[r'model\\.layers\\.61.*'] drops these keys on load, so the map names none of them",
        "checkpoint_tensors": [[n, d, s] for n, d, s in listing],
        "faked": got["faked"],
        "quantizer": type(quantizer).__name__,
        "dequantized": bool(getattr(quantizer.quantization_config, "dequantize", False)),
        "quantized_module_classes": quantized_module_classes(model),
        "model_parameters": model_state(model),
        "model_bytes_counted": counted,
        "module_bytes_counted": per_module,
        "counted_bytes_differ": differ,
        "maps": [{"name": "eight_h200_auto", "device_map": "auto", "dtype": "auto",
                  "max_memory": {str(k): v for k, v in budgets.items()}, "model_dtype": torch_name(model.dtype),
                  "result": dict(got["result"]) if "result" in got else None,
                  **({"error": got["error"]} if "error" in got else {}),
                  "max_memory_seen": got.get("max_memory_seen")}],
    }
    # deepseek-ai/DeepSeek-V3 as published: 91,991 tensors, 688,574,839,360 bytes of data (the sum
    # of its safetensors headers).
    if (len(listing), stored) != (91991, 688574839360):
        print(f"warning: {len(listing)} tensors, {stored} bytes; the published checkpoint has 91991, 688574839360",
              file=sys.stderr)
    os.makedirs(OUT_PUBLISHED, exist_ok=True)
    write_fixture(os.path.join(OUT_PUBLISHED, "deepseek_v3_fp8"), fixture)
    print(f"deepseek_v3_fp8: {len(listing)} tensors, {stored} bytes, map of {len(fixture['maps'][0]['result'] or {})} "
          f"entries", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases to regenerate")
    ap.add_argument("--published", action="store_true", help="the DeepSeek-V3 FP8 headers and map")
    args = ap.parse_args()
    if args.published:
        published()
        return
    os.makedirs(OUT, exist_ok=True)
    generate(args.only or list(CASES))


if __name__ == "__main__":
    main()
