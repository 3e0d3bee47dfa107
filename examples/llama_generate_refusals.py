#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Runs examples/llama_generate on copies of the forward fixture with one thing wrong in each (a
config.json field, a weight, the --expect file, a --prompts file, an option) and checks that each is
refused before any token is produced, with the exit status docs/exit-codes.md gives and a message that names what
is wrong. Without these checks the example crashed (SIGFPE, SIGSEGV, heap corruption), hung on a
FIFO, or exited 0 with garbage tokens or a check that compared nothing.

usage: llama_generate_refusals.py LLAMA_GENERATE FORWARD_FIXTURE QUANTIZED_FIXTURES WORK_DIR [CASE ...]

Each case gets its own copy of FORWARD_FIXTURE under WORK_DIR. With CASE names, only those run.
Prints one line per case and exits 1 when any case fails.
"""

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

TIMEOUT_S = 60  # per run; a refusal takes milliseconds, so only a hang comes near it
BIG = 1 << 40


# ---- changes to a copy of the fixture -------------------------------------------------------

def edit_json(path, change):
    with open(path) as f:
        value = json.load(f)
    change(value)
    with open(path, "w") as f:
        json.dump(value, f)


def config(**fields):
    """Sets config.json fields; a None value deletes the field; 'a__b' sets b inside a."""
    def change(c):
        for key, value in fields.items():
            *parents, leaf = key.split("__")
            target = c
            for p in parents:
                target = target[p]
            if value is None:
                target.pop(leaf, None)
            else:
                target[leaf] = value
    return lambda d: edit_json(os.path.join(d, "config.json"), change)


def config_text(text):
    def setup(d):
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(text)
    return setup


def golden(change):
    return lambda d: edit_json(os.path.join(d, "golden.json"), change)


def prompts_file(text):
    """Writes `text` as prompts.txt in the copy (options name it {d}/prompts.txt)."""
    def setup(d):
        with open(os.path.join(d, "prompts.txt"), "w") as f:
            f.write(text)
    return setup


def both(*setups):
    def setup(d):
        for s in setups:
            s(d)
    return setup


def fifo(name):
    def setup(d):
        os.remove(os.path.join(d, name))
        os.mkfifo(os.path.join(d, name))
    return setup


def tensors(d):
    """(shard path, data offset, header) of every shard."""
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                yield path, 8 + n, json.loads(f.read(n))


def poison(tensor, half_bits=0x7FC0):
    """Overwrites every element of a 16-bit tensor with `half_bits` (bfloat16 NaN by default)."""
    def setup(d):
        for path, data, header in tensors(d):
            if tensor in header:
                begin, end = header[tensor]["data_offsets"]
                with open(path, "r+b") as f:
                    f.seek(data + begin)
                    f.write(struct.pack("<H", half_bits) * ((end - begin) // 2))
                return
        raise SystemExit(f"fixture has no tensor {tensor}")
    return setup


def rename(tensor, new_name):
    """Renames a tensor (same length) in its shard's header and in the index."""
    assert len(tensor) == len(new_name)
    def setup(d):
        for path, _, _ in tensors(d):
            with open(path, "r+b") as f:
                raw = f.read()
                if f'"{tensor}"'.encode() in raw:
                    f.seek(0)
                    f.write(raw.replace(f'"{tensor}"'.encode(), f'"{new_name}"'.encode(), 1))
        edit_json(os.path.join(d, "model.safetensors.index.json"),
                  lambda i: i["weight_map"].__setitem__(new_name, i["weight_map"].pop(tensor)))
    return setup


def nothing(d):
    pass


# ---- the cases ------------------------------------------------------------------------------

# Exit statuses (docs/exit-codes.md): 2 command line, 3 the --expect file, 4 not implemented by the
# example, 6 config.json or the checkpoint.
EXPECT = ["--expect", "{d}/golden.json", "--no-gpu", "--max-memory", "cpu=700KiB"]
NO_EXPECT = ["--no-gpu", "--max-memory", "cpu=700KiB", "--new-tokens", "2"]
ON_GPU = ["--simulate-gpus", "4MiB", "--max-memory", "0=4MiB", "--new-tokens", "2"]
SHAPE = r"; config\.json does not describe these weights"

CASES = [
    # name, change to the copy, options (after --checkpoint), exit status, message (a regex)
    ("control: the unchanged fixture matches transformers", nothing, EXPECT, 0,
     r"matches transformers: tokens identical, .*\(prompt \d's step \d; 9 prompts x 8 steps compared"),
    ("control: --prompt one of the --expect file's prompts", nothing, EXPECT + ["--prompt", "235,493,286"], 0,
     r"prompt 235,493,286 -> tokens 57,188,445,506,15,298,217,498\n(.*\n)*matches transformers: tokens identical, .*"
     r"\(step \d of 8 compared"),
    ("control: --prompts FILE with two of the --expect file's prompts, a comment and a blank line",
     prompts_file("# two of the golden prompts\n\n  502\n213, 422\r\n"), EXPECT + ["--prompts", "{d}/prompts.txt"], 0,
     r"prompt 502 -> tokens 366,12,220,63,366,89,343,222\nprompt 213,422 -> tokens 425,425,481,481,82,448,104,104\n"
     r"(.*\n)*matches transformers: tokens identical, .*2 prompts x 8 steps compared"),

    # config.json: values no Llama can have
    ("num_attention_heads 0", config(num_attention_heads=0), EXPECT, 6,
     r"config\.json's num_attention_heads is 0, not a whole number >= 1"),
    ("num_key_value_heads 0", config(num_key_value_heads=0), EXPECT, 6,
     r"config\.json's num_key_value_heads is 0, not a whole number >= 1"),
    ("head_dim 0", config(head_dim=0), EXPECT, 6, r"config\.json's head_dim is 0, not a whole number >= 1"),
    ("max_position_embeddings 0", config(max_position_embeddings=0), EXPECT, 6,
     r"config\.json's max_position_embeddings is 0, not a whole number >= 1"),
    ("rope_theta 0", config(rope_parameters__rope_theta=0.0), EXPECT, 6,
     r"config\.json's rope_parameters\.rope_theta is 0(\.0)?, not a number > 0"),
    ("rope_theta -1 at the top level (older transformers)", config(rope_parameters=None, rope_theta=-1.0), EXPECT, 6,
     r"config\.json's rope_theta is -1(\.0)?, not a number > 0"),
    ("rms_norm_eps -1", config(rms_norm_eps=-1.0), EXPECT, 6, r"config\.json's rms_norm_eps is -1(\.0)?, not a number >= 0"),
    ("num_attention_heads 3, not a multiple of num_key_value_heads 2", config(num_attention_heads=3), EXPECT, 6,
     r"config\.json's num_attention_heads \(3\) is not a multiple of num_key_value_heads \(2\)"),
    ("head_dim 33, odd", config(head_dim=33), EXPECT, 6, r"config\.json's head_dim is 33, odd"),
    ("num_attention_heads x head_dim overflows", config(num_attention_heads=1 << 62, num_key_value_heads=1 << 62), EXPECT, 6,
     r"config\.json's num_attention_heads × head_dim \(4611686018427387904 × 32\) overflows 64 bits"),
    # config.json: a field of the wrong type names the field
    ('hidden_size "64", a string', config(hidden_size="64"), EXPECT, 6,
     r'config\.json\'s hidden_size is "64", not a whole number >= 1'),
    ('tie_word_embeddings "no", a string', config(tie_word_embeddings="no"), EXPECT, 6,
     r'config\.json\'s tie_word_embeddings is "no", not true or false'),
    ("config.json with hidden_size twice", config_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "hidden_size": 64}'),
     EXPECT, 6, r"config\.json' is not valid JSON: duplicate key 'hidden_size'"),

    # config.json against the tensors: each field the decoder indexes with
    ("hidden_size 2^40", config(hidden_size=BIG), EXPECT, 6,
     r"config\.json's hidden_size is 1099511627776 but dimension 1 of 'model\.embed_tokens\.weight' \(shape \[512, 128\], "
     r"expected \[vocab_size, hidden_size\]\) is 128" + SHAPE),
    ("hidden_size 64", config(hidden_size=64), EXPECT, 6,
     r"config\.json's hidden_size is 64 but dimension 1 of 'model\.embed_tokens\.weight' .* is 128" + SHAPE),
    ("hidden_size 256", config(hidden_size=256), EXPECT, 6,
     r"config\.json's hidden_size is 256 but dimension 1 of 'model\.embed_tokens\.weight' .* is 128" + SHAPE),
    ("vocab_size 256", config(vocab_size=256), EXPECT, 6,
     r"config\.json's vocab_size is 256 but dimension 0 of 'model\.embed_tokens\.weight' .* is 512" + SHAPE),
    ("vocab_size 10^6, the table on a simulated GPU, prompt token 600", config(vocab_size=10**6), ON_GPU + ["--prompt", "1,600"], 6,
     r"config\.json's vocab_size is 1000000 but dimension 0 of 'model\.embed_tokens\.weight' .* is 512" + SHAPE),
    ("vocab_size 10^6, the table on a simulated GPU, prompt token 900000", config(vocab_size=10**6), ON_GPU + ["--prompt", "1,900000"], 6,
     r"config\.json's vocab_size is 1000000 but dimension 0 of 'model\.embed_tokens\.weight' .* is 512" + SHAPE),
    ("intermediate_size 512", config(intermediate_size=512), EXPECT, 6,
     r"config\.json's intermediate_size is 512 but dimension 0 of 'model\.layers\.0\.mlp\.gate_proj\.weight' .* is 256" + SHAPE),
    ("head_dim 16", config(head_dim=16), EXPECT, 6,
     r"config\.json's num_attention_heads × head_dim \(4 × 16\) is 64 but dimension 0 of "
     r"'model\.layers\.0\.self_attn\.q_proj\.weight' .* is 128" + SHAPE),
    ("num_key_value_heads 4", config(num_key_value_heads=4), EXPECT, 6,
     r"config\.json's num_key_value_heads × head_dim \(4 × 32\) is 128 but dimension 0 of "
     r"'model\.layers\.0\.self_attn\.k_proj\.weight' .* is 64" + SHAPE),
    ("num_hidden_layers 5, one more than stored", config(num_hidden_layers=5), EXPECT, 6,
     r"the checkpoint has no tensor 'model\.layers\.4\.self_attn\.q_proj\.weight' although config\.json's num_hidden_layers is 5"),
    ("num_hidden_layers 3, one fewer than stored", config(num_hidden_layers=3), EXPECT, 6,
     r"the checkpoint has 'model\.layers\.3\.[a-z_.]+' but config\.json's num_hidden_layers is 3"),
    ("no lm_head with untied embeddings", rename("lm_head.weight", "lm_heaX.weight"), EXPECT, 6,
     r"the checkpoint has no tensor 'lm_head\.weight' although config\.json's tie_word_embeddings is false"),

    # files that are not regular files are refused, never waited on
    ("config.json is a FIFO", fifo("config.json"), EXPECT, 6, r"(?i)config\.json'.*(fifo|pipe|not a (regular )?file)"),
    ("the --expect file is a FIFO", fifo("golden.json"), EXPECT, 3, r"(?i)golden\.json'.*(fifo|pipe|not a (regular )?file)"),

    # a weight that makes the logits NaN: an error naming the step, never a token
    ("NaN final norm weight", poison("model.norm.weight"), EXPECT, 6,
     r"prompt 0 \(the --expect file's prompts\[0\]\), step 0 \(the logits after position 7\): the logit of token 0 is -?nan, "
     r"so no token can be chosen"),

    # the --expect file: a check that compares nothing must fail
    ("golden logits empty", golden(lambda g: g["prompts"][0].__setitem__("logits", [])), EXPECT, 3,
     r"the --expect file: prompts\[0\]\.logits is \[\], not a list of 8 steps' logits, one per token; a check that compares nothing"),
    ("golden logits one step short", golden(lambda g: g["prompts"][0]["logits"].pop()), EXPECT, 3,
     r"the --expect file: prompts\[0\]\.logits has 7 steps but prompts\[0\]\.tokens has 8; each generated token needs its step's logits"),
    ("golden tokens empty", golden(lambda g: g["prompts"][0].__setitem__("tokens", [])), EXPECT, 3,
     r"the --expect file: prompts\[0\]\.tokens is \[\], not a non-empty list of token ids"),
    ("golden tokens of a later prompt one short", golden(lambda g: g["prompts"][3]["tokens"].pop()), EXPECT, 3,
     r"the --expect file: prompts\[3\]\.tokens holds 7 tokens but new_tokens is 8"),
    ("golden prompt empty", golden(lambda g: g["prompts"][0].__setitem__("prompt", [])), EXPECT, 3,
     r"the --expect file: prompts\[0\]\.prompt is \[\], not a non-empty list of token ids"),
    ("golden prompts empty", golden(lambda g: g.__setitem__("prompts", [])), EXPECT, 3,
     r"the --expect file: prompts is \[\], not a non-empty list of prompts with their tokens and logits"),
    ("golden in the single-prompt format (no prompts)", golden(lambda g: g.pop("prompts")), EXPECT, 3,
     r"the --expect file: prompts is missing, not a non-empty list .*regenerate it with tests/compat/gen_forward\.py"),
    ("golden prompts entry that is not an object", golden(lambda g: g["prompts"].__setitem__(4, 5)), EXPECT, 3,
     r"the --expect file: prompts\[4\] is 5, not an object with prompt, tokens and logits"),
    ("golden logit that is a string", golden(lambda g: g["prompts"][6]["logits"][2].__setitem__(7, "x")), EXPECT, 3,
     r"the --expect file: prompts\[6\]\.logits\[2\] holds \"x\", not a finite number"),
    ("golden token id that is negative", golden(lambda g: g["prompts"][1]["tokens"].__setitem__(0, -3)), EXPECT, 3,
     r"the --expect file: prompts\[1\]\.tokens holds -3, not a token id"),
    ("golden new_tokens 0", golden(lambda g: g.__setitem__("new_tokens", 0)), EXPECT, 3,
     r"the --expect file: new_tokens is 0, not a whole number >= 1"),
    ("golden logits one entry short of the vocabulary",
     golden(lambda g: [row.pop() for run in g["prompts"] for row in run["logits"]]), EXPECT, 3,
     r"the --expect file: its logits have 511 entries per step but the model's vocabulary has 512 ids"),
    ("golden logits of a later prompt one entry short", golden(lambda g: g["prompts"][2]["logits"][0].pop()), EXPECT, 3,
     r"the --expect file: prompts\[2\]\.logits\[0\] is .*, not a list of 512 numbers like the first step's"),
    ("golden prompt token outside the vocabulary", golden(lambda g: g["prompts"][1].__setitem__("prompt", [1, 9999])), EXPECT, 3,
     r"the --expect file: prompt 1 \(the --expect file's prompts\[1\]\) holds token 9999, outside the vocabulary: "
     r"'model\.embed_tokens\.weight' has 512 rows"),
    ("--new-tokens beyond the golden's steps", nothing, EXPECT + ["--new-tokens", "9"], 2,
     r"--new-tokens 9 asks for more steps than the --expect file's 8"),
    ("--prompt other than the golden's", nothing, EXPECT + ["--prompt", "1,2"], 2,
     r"the prompt \(1,2\) is not among the --expect file's 9 prompts, and its logits are for those"),
    ("--prompts with a line other than the golden's", prompts_file("502\n1,2\n"), EXPECT + ["--prompts", "{d}/prompts.txt"], 2,
     r"prompt 1 \(.*prompts\.txt line 2\) \(1,2\) is not among the --expect file's 9 prompts"),

    # --prompts FILE: a bad line is refused naming it
    ("--prompts line that is not token ids", prompts_file("1,2\n# a comment\n\n3,x,4\n"), NO_EXPECT + ["--prompts", "{d}/prompts.txt"], 2,
     r"--prompts file '.*prompts\.txt' line 4: 'x' is not a token id \(a whole number >= 0\)"),
    ("--prompts line with an empty id", prompts_file("1,,2\n"), NO_EXPECT + ["--prompts", "{d}/prompts.txt"], 2,
     r"--prompts file '.*prompts\.txt' line 1: '' is not a token id"),
    ("--prompts line with a negative id", prompts_file("5\n7, -1\n"), NO_EXPECT + ["--prompts", "{d}/prompts.txt"], 2,
     r"--prompts file '.*prompts\.txt' line 2: '-1' is not a token id"),
    ("--prompts file with comments only", prompts_file("# nothing\n\n   \n"), NO_EXPECT + ["--prompts", "{d}/prompts.txt"], 2,
     r"--prompts file '.*prompts\.txt' holds no prompt"),
    ("--prompts file missing", nothing, NO_EXPECT + ["--prompts", "{d}/missing.txt"], 2, r"--prompts file '.*missing\.txt'"),
    ("--prompts file is a FIFO", both(prompts_file(""), fifo("prompts.txt")),
     NO_EXPECT + ["--prompts", "{d}/prompts.txt"], 2, r"(?i)prompts\.txt'.*(fifo|pipe|not a (regular )?file)"),
    ("--prompts token outside the vocabulary, naming the prompt and its line", prompts_file("1,2\n\n3,512,4\n"),
     NO_EXPECT + ["--prompts", "{d}/prompts.txt"], 2,
     r"prompt 1 \(.*prompts\.txt line 3\) holds token 512, outside the vocabulary: 'model\.embed_tokens\.weight' has 512 rows"),
    ("--prompts prompt beyond max_position_embeddings, naming the prompt and its line",
     both(config(max_position_embeddings=10), prompts_file("1\n1,2,3,4,5,6,7,8,9\n")), NO_EXPECT + ["--prompts", "{d}/prompts.txt"], 2,
     r"prompt 1 \(.*prompts\.txt line 2\) has 9 tokens; with 2 new tokens it needs 11 positions, more than config\.json's "
     r"max_position_embeddings 10"),
    ("--prompt and --prompts together", prompts_file("1\n"), NO_EXPECT + ["--prompt", "1", "--prompts", "{d}/prompts.txt"], 2,
     r"give --prompt or --prompts FILE, not both"),
    ("no prompt at all", nothing, NO_EXPECT, 2, r"give --prompt, --prompts FILE, or --expect with a golden file"),
    ("--stages 0", nothing, EXPECT + ["--stages", "0"], 2,
     r"--stages takes how many pipeline stages each replica has, a whole number >= 1; got '0'"),
    ("--stages 2 for one process", nothing, EXPECT + ["--stages", "2"], 2,
     r"--stages 2 does not divide the job's 1 process; run R x S processes"),

    # the command line
    ("--prompt x", nothing, ["--no-gpu", "--prompt", "x"], 2,
     r"--prompt takes token ids separated by commas, like 1,17,254; 'x' in 'x' is not a whole number >= 0"),
    ("--prompt 1,,2", nothing, ["--no-gpu", "--prompt", "1,,2"], 2, r"--prompt takes token ids .*; '' in '1,,2' is not a whole number"),
    ("--prompt ''", nothing, ["--no-gpu", "--prompt", ""], 2, r"--prompt is empty; give the prompt's token ids separated by commas"),
    ("--prompt -1", nothing, ["--no-gpu", "--prompt", "-1"], 2, r"--prompt takes token ids .*; '-1' in '-1' is not a whole number >= 0"),
    ("--prompt token outside the vocabulary", nothing, NO_EXPECT + ["--prompt", "1,9999"], 2,
     r"the prompt holds token 9999, outside the vocabulary: 'model\.embed_tokens\.weight' has 512 rows, so ids go from 0 to 511"),
    ("--new-tokens x", nothing, ["--no-gpu", "--prompt", "1", "--new-tokens", "x"], 2,
     r"--new-tokens takes how many tokens to generate, a whole number >= 1; got 'x'"),
    ("--new-tokens -5", nothing, ["--no-gpu", "--prompt", "1", "--new-tokens", "-5"], 2,
     r"--new-tokens takes how many tokens to generate, a whole number >= 1; got '-5'"),
    ("--new-tokens 0", nothing, ["--no-gpu", "--prompt", "1", "--new-tokens", "0"], 2,
     r"--new-tokens takes how many tokens to generate, a whole number >= 1; got '0'"),
    ("--tolerance nan", nothing, EXPECT + ["--tolerance", "nan"], 2, r"--tolerance takes a finite number >= 0, like 1e-3; got 'nan'"),
    ("--tolerance inf", nothing, EXPECT + ["--tolerance", "inf"], 2, r"--tolerance takes a finite number >= 0, like 1e-3; got 'inf'"),
    ("--tolerance -1", nothing, EXPECT + ["--tolerance", "-1"], 2, r"--tolerance takes a finite number >= 0, like 1e-3; got '-1'"),
    ("--tolerance x", nothing, EXPECT + ["--tolerance", "x"], 2, r"--tolerance takes a finite number >= 0, like 1e-3; got 'x'"),
    ("prompt and new tokens beyond max_position_embeddings", config(max_position_embeddings=10),
     ["--no-gpu", "--prompt", "1,2,3", "--new-tokens", "8"], 2,
     r"the prompt has 3 tokens; with 8 new tokens it needs 11 positions, more than config\.json's max_position_embeddings 10; "
     r"give fewer --new-tokens"),
]

# Other fixtures: what the example does not implement (exit 4). {q} is QUANTIZED_FIXTURES.
OTHER_CHECKPOINTS = [
    ("another architecture", "{q}/mxfp4_gpt_oss", ["--prompt", "1", "--no-gpu"], 4,
     r'architecture is "GptOssForCausalLM"; this example implements LlamaForCausalLM only'),
    ("a quantized weight", "{q}/fp8_llama", ["--prompt", "1", "--no-gpu"], 4,
     r"'model\.layers\.0\.self_attn\.q_proj\.weight' is float8_e4m3fn; this example reads float32, bfloat16 and float16"),
]


def describe(code):
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def run_case(binary, checkpoint, options, code, pattern):
    """None when the run went as expected, else what went wrong."""
    command = [binary, "--checkpoint", checkpoint] + [o.format(d=checkpoint) for o in options]
    try:
        done = subprocess.run(command, capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"hung (killed after {TIMEOUT_S} s)"
    output = (done.stdout + done.stderr).decode("utf-8", "replace")
    problems = []
    if done.returncode != code:
        problems.append(f"{describe(done.returncode)}, expected exit {code}")
    if not re.search(pattern, output):
        problems.append(f"no message matching {pattern!r}")
    if code != 0 and "-> tokens" in output:
        problems.append("produced tokens before refusing")
    if problems:
        return "; ".join(problems) + "\n    output: " + output.strip().replace("\n", "\n            ")
    return None


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    binary, fixture, quantized, work = argv[1:5]
    only = set(argv[5:])
    cases = [(name, setup, opts, code, pattern, None) for name, setup, opts, code, pattern in CASES]
    cases += [(name, nothing, opts, code, pattern, path.format(q=quantized)) for name, path, opts, code, pattern in OTHER_CHECKPOINTS]
    unknown = only - {c[0] for c in cases}
    if unknown:
        print(f"unknown cases: {sorted(unknown)}", file=sys.stderr)
        return 2
    failed = 0
    for i, (name, setup, options, code, pattern, checkpoint) in enumerate(cases):
        if only and name not in only:
            continue
        if checkpoint is None:
            checkpoint = os.path.join(work, f"case-{i:02d}")
            shutil.rmtree(checkpoint, ignore_errors=True)
            os.makedirs(work, exist_ok=True)
            shutil.copytree(fixture, checkpoint)
            setup(checkpoint)
        problem = run_case(binary, checkpoint, options, code, pattern)
        if problem:
            failed += 1
            print(f"FAIL {name}: {problem}")
        else:
            print(f"ok   {name}")
    print(f"llama_generate refusals: {failed} of {len(only) or len(cases)} cases failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
