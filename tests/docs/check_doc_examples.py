#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Checks every example in README.md and docs/**/*.md, so no example in the docs can rot (a ctest).

Every fenced code block (``` or ~~~, also indented inside a list item) is taken by its info
string, the text after the opening fence:

  ```cpp           A complete translation unit, compiled with this build's compiler and flags plus
                   -std=c++20 -fsyntax-only (checked, not linked: main() need not be reachable, but
                   every name must be declared). Without an #include line, #include
                   <accel/accel.hpp> is put on top.
  ```cpp snippet   Statements: the body of a function, compiled the same way as

                       #include <accel/accel.hpp>   (and <cstdio> <iostream> <string> <vector>)
                       [[maybe_unused]] static void accel_doc_snippet(
                           [[maybe_unused]] accel::DistributedState& state) { <block> }

                   so a snippet may use `state`, but must not declare it again, and every other
                   name it uses must be declared in the block. Use a ```cpp block for code that
                   needs its own types or functions at namespace scope.
  ```sh            A script, run as `bash -euo pipefail -c <block>` (any failing command, unset
                   variable or failing pipe stage fails it) in a fresh temporary folder holding
                   the links examples/, tests/, include/ and benchmarks/ to the repository's. PATH
                   starts with the folder of this build's `accel` and the built examples folder;
                   ACCEL_DOCS=1 is set; 120 s at most. Plain commands only: no `$ ` prompts, no
                   output lines (use ```console or ```text for transcripts).
  ```sh norun      Not run (it needs GPUs, a checkpoint, several machines...). Checked with
                   `bash -n`, and every command line invoking `accel <subcommand> ...` (after
                   optional VAR=value assignments and a `$ ` prompt, continued with trailing
                   backslashes, one stage of a pipe or && list) is checked against
                   `accel <subcommand> --help`: it must exit 0 and mention every --option the line
                   uses (the part before `=`). Options after a standalone `--`, and for
                   `accel launch` everything from the program on, belong to the user's program
                   and are not checked; other commands, heredoc bodies and comments are only
                   syntax-checked.

Any other info string (cmake, json, text, console, an empty one) and indented code blocks are not
checked. A ```cpp or ```sh fence with any other word after the language (```sh no-run) fails, and
so does a fence that is never closed: both would hide examples. A fence closes with the same
character, at least as long, so a ~~~ block may show ``` fences (and a ```` block ``` ones).

Usage:
  check_doc_examples.py --root DIR --accel PATH --examples-dir DIR --cxx PATH
                        [--cxx-flag=FLAG ...] [--jobs N]
  check_doc_examples.py --self-test --accel PATH --cxx PATH [--cxx-flag=FLAG ...]

Prints `PASS file:line kind` or `FAIL file:line kind: reason` (the compiler's or the script's
output indented below) per block, then `doc examples: N checked, M failed`. Exit status 1 when a
block failed or when no block was found at all; 0 otherwise. --self-test writes a README.md with a
good and a broken block of each kind to a temporary folder, checks it, and exits 0 only when
exactly the broken blocks fail.
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

SH_TIMEOUT_S = 120
CXX_TIMEOUT_S = 300
HELP_TIMEOUT_S = 30
OUTPUT_LINES = 60  # of a failing block's output shown
LINKED_FOLDERS = ("examples", "tests", "include", "benchmarks")
PROGRAM_SUBCOMMANDS = {"launch"}  # `accel launch [options] program args...`: args are the program's
COMMAND_WRAPPERS = {"time", "exec", "nohup"}

FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
INCLUDE_LINE = re.compile(r"^\s*#\s*include\b", re.M)
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HEREDOC = re.compile(r"<<-?[ \t]*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
HELP_OPTION_LINE = re.compile(r"^\s{1,8}(?:-\w,\s+)?(--[A-Za-z0-9][\w-]*)(?:[ =]([^\s-]\S*))?(?:\s{2,}|\s*$)")

SNIPPET_PRELUDE = """#include <accel/accel.hpp>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

[[maybe_unused]] static void accel_doc_snippet([[maybe_unused]] accel::DistributedState& state) {
"""


@dataclass
class Block:
    path: str       # relative to the root, as reported
    line: int       # the opening fence's line (1-based)
    kind: str       # "cpp", "cpp snippet", "sh", "sh norun"; or the bad info string / "fence"
    body: str
    body_line: int  # the block's first line
    problem: str = ""  # set: the block fails as it stands (bad info string, unclosed fence)


@dataclass
class Result:
    ok: bool
    reason: str = ""
    output: str = ""


@dataclass
class Context:
    root: str
    accel: str
    examples_dir: str
    cxx: str
    cxx_flags: list
    sh_timeout_s: int = SH_TIMEOUT_S


# ------------------------------------------------------------------------------------------------
# Finding the blocks


def strip_indent(line, width):
    """Removes up to `width` columns of leading whitespace (a fence's own indentation)."""
    line = line.expandtabs(4)
    n = len(line) - len(line.lstrip(" "))
    return line[min(n, width):]


def classify(info):
    """(kind, problem) for an info string; kind None: not checked."""
    words = info.split()
    if not words or words[0] not in ("cpp", "sh"):
        return None, ""
    lang, mods = words[0], words[1:]
    known = {"cpp": ["snippet"], "sh": ["norun"]}[lang]
    if not mods:
        return lang, ""
    if len(mods) == 1 and mods[0] in known:
        return f"{lang} {mods[0]}", ""
    return info.strip(), (f"unknown info string '{info.strip()}': use '{lang}' or '{lang} {known[0]}' "
                          f"(or another language to leave the block unchecked)")


def extract_blocks(text, path):
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"].expandtabs(4))
        close = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        kind, problem = classify(m["info"])
        body = "\n".join(strip_indent(l, indent) for l in lines[i + 1:j]) + "\n"
        if j == len(lines):
            blocks.append(Block(path, i + 1, kind or "fence", body, i + 2,
                                f"the {fence} fence opened here is never closed, so it hides the rest of the file"))
        elif kind:
            blocks.append(Block(path, i + 1, kind, body, i + 2, problem))
        i = j + 1
    return blocks


def find_blocks(root):
    files = []
    if os.path.isfile(os.path.join(root, "README.md")):
        files.append("README.md")
    for d, dirs, names in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        files += sorted(os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".md"))
    blocks = []
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            blocks += extract_blocks(f.read(), rel)
    return blocks


# ------------------------------------------------------------------------------------------------
# The checks


def run_captured(cmd, timeout, **kw):
    """(exit status or None on timeout, output)."""
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace", timeout=timeout, **kw)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        return None, out


def line_directive(block):
    path = block.path.replace("\\", "\\\\").replace('"', '\\"')
    return f'#line {block.body_line} "{path}"\n'


def check_cpp(block, ctx):
    if block.kind == "cpp snippet":
        source = SNIPPET_PRELUDE + line_directive(block) + block.body + "}\n"
    else:
        top = "" if INCLUDE_LINE.search(block.body) else "#include <accel/accel.hpp>\n"
        source = top + line_directive(block) + block.body
    with tempfile.TemporaryDirectory(prefix="accel-doc-cpp-") as tmp:
        src = os.path.join(tmp, "example.cpp")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [ctx.cxx, "-std=c++20", *ctx.cxx_flags, "-fsyntax-only", "-x", "c++", src]
        rc, out = run_captured(cmd, CXX_TIMEOUT_S, cwd=tmp)
    if rc is None:
        return Result(False, f"the compiler ran past {CXX_TIMEOUT_S} s", out)
    if rc != 0:
        return Result(False, "does not compile", out)
    return Result(True)


def run_sh(block, ctx):
    work = tempfile.mkdtemp(prefix="accel-doc-sh-")
    try:
        for name in LINKED_FOLDERS:
            if os.path.isdir(os.path.join(ctx.root, name)):
                os.symlink(os.path.join(ctx.root, name), os.path.join(work, name))
        env = dict(os.environ)
        env["ACCEL_DOCS"] = "1"
        env["PATH"] = os.pathsep.join([os.path.dirname(ctx.accel), ctx.examples_dir, env.get("PATH", "")])
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block.body], cwd=work, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=ctx.sh_timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        try:  # the block's own process group: whatever it left running (or all of it on a timeout)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if timed_out:
            out, _ = proc.communicate()
            if proc.returncode is not None and proc.returncode >= 0:
                return Result(False, f"the script ended but left a process holding its output past "
                                     f"{ctx.sh_timeout_s} s", out)
            return Result(False, f"ran past {ctx.sh_timeout_s} s", out)
        if proc.returncode != 0:
            return Result(False, f"exit status {proc.returncode}", out)
        return Result(True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def logical_lines(body, first_line):
    """(doc line, text) per command line: backslash continuations joined, heredoc bodies left out."""
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i]
        i += 1
        stripped = text.lstrip()
        if stripped.startswith("#"):
            continue
        yield first_line + start, text
        for m in HEREDOC.finditer(text):
            if text[m.start():m.start() + 3] == "<<<":
                continue
            while i < len(lines) and lines[i].strip() != m[2]:
                i += 1
            i += 1


def shell_words(text):
    """The line's words, split into simple commands at | || && ; & ( )."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    commands, current = [], []
    for tok in lex:
        if tok and set(tok) <= set("|&;()"):
            commands.append(current)
            current = []
        else:
            current.append(tok)
    commands.append(current)
    return [c for c in commands if c]


class HelpCache:
    def __init__(self, accel):
        self.accel, self.cache = accel, {}

    def get(self, sub):
        if sub not in self.cache:
            rc, out = run_captured([self.accel, sub, "--help"], HELP_TIMEOUT_S)
            self.cache[sub] = (rc, out)
        return self.cache[sub]


def help_options(help_text):
    """{option: takes a value} from the help's option table."""
    table = {}
    for line in help_text.splitlines():
        m = HELP_OPTION_LINE.match(line)
        if m:
            table[m[1]] = m[2] is not None
    return table


def check_accel_command(words, help_cache):
    """Problems with one `accel <subcommand> ...` command (words after `accel`)."""
    if not words or words[0].startswith("-"):
        return []  # `accel --version`, `accel --help`: nothing to look up
    sub = words[0]
    rc, text = help_cache.get(sub)
    if rc != 0:
        return [f"`accel {sub} --help` exited with {rc if rc is not None else 'a timeout'}: "
                f"{(text.strip().splitlines() or ['no output'])[0]}"]
    hyphen_variants = "spelled with hyphens" in text
    norm = (lambda o: o.replace("_", "-")) if hyphen_variants else (lambda o: o)
    mentioned = {norm(o) for o in re.findall(r"--[A-Za-z0-9][\w-]*", text)}
    takes_value = {norm(o): v for o, v in help_options(text).items()}
    problems, k = [], 1
    while k < len(words):
        w = words[k]
        k += 1
        if w == "--":
            break
        if w.startswith("--"):
            name = w.split("=", 1)[0]
            if norm(name) not in mentioned:
                problems.append(f"`{name}` is not an option of `accel {sub}` (not in `accel {sub} --help`)")
            elif "=" not in w and takes_value.get(norm(name)):
                k += 1
        elif w.startswith("-") and len(w) > 1:
            continue
        elif sub in PROGRAM_SUBCOMMANDS:
            break
    return problems


def check_sh_norun(block, ctx, help_cache):
    rc, out = run_captured(["bash", "-n", "-c", block.body], HELP_TIMEOUT_S)
    if rc != 0:
        return Result(False, "bash -n: not valid shell", out)
    problems = []
    for doc_line, text in logical_lines(block.body, block.body_line):
        text = re.sub(r"^\s*\$\s+", "", text)
        try:
            commands = shell_words(text)
        except ValueError as e:
            problems.append(f"line {doc_line}: cannot split into words ({e})")
            continue
        for words in commands:
            while words and (ENV_ASSIGNMENT.match(words[0]) or words[0] in COMMAND_WRAPPERS):
                words = words[1:]
            if words and words[0] == "env":
                words = words[1:]
                while words and ENV_ASSIGNMENT.match(words[0]):
                    words = words[1:]
            if not words or os.path.basename(words[0]) != "accel":
                continue
            problems += [f"line {doc_line}: {p}" for p in check_accel_command(words[1:], help_cache)]
    if problems:
        return Result(False, "uses what accel does not accept", "\n".join(problems))
    return Result(True)


def check_all(blocks, ctx, jobs, out=sys.stdout):
    """Checks and reports every block; returns the number that failed."""
    help_cache = HelpCache(ctx.accel)
    failed = 0

    def report(block, result):
        nonlocal failed
        if result.ok:
            print(f"PASS {block.path}:{block.line} {block.kind}", file=out)
        else:
            failed += 1
            print(f"FAIL {block.path}:{block.line} {block.kind}: {result.reason}", file=out)
            lines = result.output.rstrip().splitlines()
            if len(lines) > OUTPUT_LINES:
                lines = lines[:OUTPUT_LINES] + [f"... ({len(lines) - OUTPUT_LINES} more lines)"]
            for line in lines:
                print("    " + line, file=out)
        out.flush()

    def check(block):
        if block.problem:
            return Result(False, block.problem)
        if block.kind in ("cpp", "cpp snippet"):
            return check_cpp(block, ctx)
        return check_sh_norun(block, ctx, help_cache)

    # Compiles and static checks in parallel, reported in document order; then the scripts, one at a time.
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [(b, pool.submit(check, b)) for b in blocks if b.problem or b.kind != "sh"]
        for block, future in futures:
            report(block, future.result())
    for block in blocks:
        if block.kind == "sh" and not block.problem:
            report(block, run_sh(block, ctx))
    print(f"doc examples: {len(blocks)} checked, {failed} failed", file=out)
    out.flush()
    return failed


def run_checker(ctx, jobs, out=sys.stdout):
    """The checker's exit status for ctx.root."""
    blocks = find_blocks(ctx.root)
    failed = check_all(blocks, ctx, jobs, out)
    if not blocks:
        print(f"no ```cpp or ```sh block found in {ctx.root}/README.md or docs/**/*.md: "
              f"the wrong --root, or the examples lost their info strings", file=out)
        return 1
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------------
# --self-test: proves the checker fails on broken examples (and only on those)

SELF_TEST_BLOCKS = [
    # (expected to pass, opening fence, body, closing fence); None: a block that must be ignored
    (True, "```cpp", "#include <accel/state.hpp>\n\nint main() {\n  accel::DistributedState* s = nullptr;\n"
                     "  return s != nullptr;\n}\n", "```"),
    (True, "```cpp", "static_assert(sizeof(accel::DistributedState) > 0);  // no #include: accel.hpp added\n"
                     "int main() {}\n", "```"),
    (False, "```cpp", "int main() { return accel_no_such_function(); }\n", "```"),
    (True, "```cpp snippet", "std::vector<std::string> items = {\"a\", \"b\"};\n"
                             "std::cout << state.process_index() << \" \" << items.size() << \"\\n\";\n", "```"),
    (False, "```cpp snippet", "state.no_such_member();\n", "```"),
    (True, "```sh", "test \"$ACCEL_DOCS\" = 1\ntest -f examples/marker.txt\ntest ! -e README.md\n"
                    "accel version\naccel_doc_selftest_tool\n", "```"),
    (False, "```sh", "false | cat\necho 'pipefail should have stopped this'\n", "```"),
    (False, "```sh", "echo \"$ACCEL_DOC_NO_SUCH_VARIABLE\"\n", "```"),
    (False, "```sh", "sleep 30\n", "```"),  # past the self-test's 3 s limit
    (True, "```sh norun", "$ ACCEL_TIMEOUT_S=60 accel plan --checkpoint ckpt/ \\\n"
                          "    --max-memory=0=20GiB,cpu=64GiB --json | grep --no-such-grep-option x\n"
                          "accel launch --num-processes 2 --cpu ./infer --prompts p.txt --whatever\n"
                          "accel launch --gpu_ids 0,1 -- ./infer --anything-goes\n"
                          "cat > notes.txt <<'EOF'\naccel plan --inside-a-heredoc\nEOF\n"
                          "python3 train.py --not-accel  # accel plan --in-a-comment\n", "```"),
    (False, "```sh norun", "accel plan --checkpoint ckpt/ --no-such-option 1\n", "```"),
    (False, "```sh norun", "if true; then echo missing fi\n", "```"),
    (False, "```sh norun", "accel no-such-subcommand --json\n", "```"),
    (False, "```sh no-run", "echo a typo in the info string must not go unnoticed\n", "```"),
    (None, "```cmake", "this is not cmake at all (\n", "```"),
    (None, "```json", "{ not json\n", "```"),
    (None, "```", "accel plan --bogus\n", "```"),
    (None, "~~~text", "```cpp\nint main() { broken }\n```\n", "~~~"),
    (None, "````markdown", "```sh\nfalse\n```\n", "````"),
]


def write_self_test_root(root):
    """Writes README.md and docs/guide/more.md; returns {(file, line): expected to pass}."""
    expected, lines = {}, ["# self-test", "", "Indented code is not checked:", "",
                           "    accel plan --bogus", "    false", ""]
    for ok, opening, body, closing in SELF_TEST_BLOCKS:
        if ok is not None:
            expected[("README.md", len(lines) + 1)] = ok
        lines += [opening, *body.rstrip("\n").split("\n"), closing, ""]
    # A fence indented inside a list item (its body indented alike).
    lines += ["1. Step one:", ""]
    expected[("README.md", len(lines) + 1)] = True
    lines += ["   ```cpp snippet", "   std::puts(\"indented\");", "   if (state.process_index() < 0)",
              "     return;", "   ```", ""]
    with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.makedirs(os.path.join(root, "docs", "guide"))
    more = ["# more", "", "~~~sh norun", "accel estimate-memory --checkpoint ckpt/ --json", "~~~", "",
            "~~~cpp snippet", "std::puts(undeclared_name);", "~~~", ""]
    with open(os.path.join(root, "docs", "guide", "more.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(more) + "\n")
    expected[(os.path.join("docs", "guide", "more.md"), 3)] = True
    expected[(os.path.join("docs", "guide", "more.md"), 7)] = False
    os.makedirs(os.path.join(root, "examples"))
    with open(os.path.join(root, "examples", "marker.txt"), "w", encoding="utf-8") as f:
        f.write("linked\n")
    return expected


def self_test(args):
    import io
    with tempfile.TemporaryDirectory(prefix="accel-doc-selftest-") as tmp:
        root, examples = os.path.join(tmp, "root"), os.path.join(tmp, "examples-build")
        os.makedirs(root)
        os.makedirs(examples)
        tool = os.path.join(examples, "accel_doc_selftest_tool")
        with open(tool, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(tool, 0o755)
        expected = write_self_test_root(root)
        ctx = Context(root, args.accel, examples, args.cxx, args.cxx_flag, sh_timeout_s=3)
        buf = io.StringIO()
        status = run_checker(ctx, args.jobs, buf)
        report = buf.getvalue()
        print(report, end="")
        got = {}
        for m in re.finditer(r"^(PASS|FAIL) (.+?):(\d+) ", report, re.M):
            got[(m[2], int(m[3]))] = m[1] == "PASS"
        problems = []
        for key in sorted(set(expected) | set(got)):
            want, have = expected.get(key), got.get(key)
            if want is None:
                problems.append(f"{key[0]}:{key[1]} was checked, but must be ignored")
            elif have is None:
                problems.append(f"{key[0]}:{key[1]} was not checked")
            elif want != have:
                problems.append(f"{key[0]}:{key[1]} should {'pass' if want else 'fail'}, but it "
                                f"{'passed' if have else 'failed'}")
        if status != 1:
            problems.append(f"the checker exited with {status}, not 1, with broken blocks present")
        empty = os.path.join(tmp, "empty")
        os.makedirs(os.path.join(empty, "docs"))
        with open(os.path.join(empty, "README.md"), "w", encoding="utf-8") as f:
            f.write("# nothing to check\n\n```text\nplain\n```\n")
        if run_checker(Context(empty, args.accel, examples, args.cxx, args.cxx_flag), 1, io.StringIO()) != 1:
            problems.append("a root without any checked block did not fail")
    broken = sum(1 for v in expected.values() if not v)
    if problems:
        print("self-test FAILED:")
        for p in problems:
            print("  " + p)
        return 1
    print(f"self-test: OK: the {broken} broken blocks failed, the {len(expected) - broken} good ones passed, "
          f"ignored blocks were ignored, and an empty root failed")
    return 0


# ------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                 epilog="See the module docstring for the block conventions.")
    ap.add_argument("--root", help="repository root: README.md and docs/**/*.md are checked")
    ap.add_argument("--accel", required=True, help="the accel binary (its folder goes first on PATH)")
    ap.add_argument("--examples-dir", help="the built examples' folder (on PATH for ```sh blocks)")
    ap.add_argument("--cxx", required=True, help="C++ compiler")
    ap.add_argument("--cxx-flag", action="append", default=[],
                    help="compiler flag (repeatable; write --cxx-flag=-Wall). A bare -I (an empty "
                         "include-directory list) is dropped")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compiles (default 2)")
    ap.add_argument("--self-test", action="store_true",
                    help="check a generated README with good and broken blocks; exit 0 when exactly the broken fail")
    args = ap.parse_args()
    args.cxx_flag = [f for f in args.cxx_flag if f != "-I"]
    args.accel = os.path.abspath(args.accel)
    if args.self_test:
        return self_test(args)
    if not args.root or not args.examples_dir:
        ap.error("--root and --examples-dir are required (unless --self-test)")
    ctx = Context(os.path.abspath(args.root), args.accel, os.path.abspath(args.examples_dir), args.cxx,
                  args.cxx_flag)
    return run_checker(ctx, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
