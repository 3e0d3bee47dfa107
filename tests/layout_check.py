#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The include-layout test: the folders under include/accel/ are the architecture, and this keeps
them so. It fails (exit 1, one line per finding) on

  - an include of a higher layer or of a sibling layer (runtime <- {comm, model} <- {launch, plan} <- load),
  - an include cycle among the library's headers,
  - an `#include` below the first line of code,
  - a file under <layer>/detail/ included from outside that layer (tests/<layer>/ counts as inside),
  - <accel/state.hpp> reaching nlohmann/json or a layer above runtime,
  - with --cxx: a public header that does not compile on its own.

With --backend-headers-only (before --cxx), only the public headers whose includes reach code that
depends on CUDA or NCCL are compiled: the others preprocess to the same text in every
configuration, so a build that checks another configuration in full need not compile them again
(tests/run.sh compiles them all in its CUDA/NCCL-off configuration).

Usage: layout_check.py <source root> [--backend-headers-only] [--cxx COMPILER [flags...]]
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

RANK = {"runtime": 0, "comm": 1, "model": 1, "launch": 2, "plan": 2, "load": 3, "": 4}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# Text that makes a header differ between the CUDA/NCCL configurations. runtime/config.hpp, which
# defines the switches, is compiled in every configuration as a header of its own.
BACKEND = re.compile(r"ACCEL_(WITH|HAS)_(CUDA|NCCL)|<cuda|<nccl")
CONFIG = "runtime/config.hpp"


def layer_of(rel):
    """'plan/detail/x.hpp' -> 'plan'; 'state.hpp' -> '' (the top: entry point and umbrella)."""
    head = rel.split("/", 1)[0]
    return head if head in RANK and "/" in rel else ""


def scan(path):
    """Returns ([(line number, quote, target)], first code line number or None)."""
    includes, first_code, continued, in_comment = [], None, False, False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if continued:  # a macro body continued with a backslash is still preprocessor text
                continued = text.endswith("\\")
                continue
            if in_comment:
                in_comment = "*/" not in text
                continue
            if text.startswith("/*"):
                in_comment = "*/" not in text
                continue
            if not text or text.startswith("//"):
                continue
            if text.startswith("#"):
                m = INCLUDE.match(line)
                if m:
                    includes.append((n, m.group(1), m.group(2)))
                continued = text.endswith("\\")
                continue
            if first_code is None:
                first_code = n
    return includes, first_code


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    root = os.path.abspath(args[0])
    cxx = args[args.index("--cxx") + 1:] if "--cxx" in args else None
    backend_only = "--backend-headers-only" in args[:args.index("--cxx") if cxx is not None else len(args)]
    inc_root = os.path.join(root, "include", "accel")
    problems = []
    graph = {}

    headers = sorted(os.path.relpath(os.path.join(d, f), inc_root)
                     for d, _, files in os.walk(inc_root) for f in files if f.endswith(".hpp"))
    for rel in headers:
        includes, first_code = scan(os.path.join(inc_root, rel))
        me = layer_of(rel)
        graph[rel] = []
        for n, quote, target in includes:
            where = f"include/accel/{rel}:{n}"
            if quote == '"':
                problems.append(f"{where}: includes \"{target}\"; write <accel/...> so the layer is visible")
                continue
            if first_code is not None and n > first_code:
                problems.append(f"{where}: #include <{target}> below the first line of code (line {first_code})")
            if not target.startswith("accel/"):
                continue
            dep = target[len("accel/"):]
            if dep not in headers:
                problems.append(f"{where}: includes <{target}>, which does not exist")
                continue
            graph[rel].append(dep)
            them = layer_of(dep)
            if them != me and RANK[them] >= RANK[me]:
                kind = "a sibling" if RANK[them] == RANK[me] else "a higher"
                problems.append(f"{where}: layer '{me or 'top'}' includes <{target}> of {kind} layer '{them or 'top'}'")
            if "/detail/" in dep and them != me:
                problems.append(f"{where}: includes <{target}>, private to layer '{them}'")

    # Cycles: depth-first search with colours.
    colour, stack = {}, []

    def visit(h):
        colour[h] = 1
        stack.append(h)
        for d in graph[h]:
            if colour.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                problems.append("include cycle: " + " -> ".join(cycle))
            elif d not in colour:
                visit(d)
        stack.pop()
        colour[h] = 2

    for h in headers:
        if h not in colour:
            visit(h)

    # detail/ headers used from outside their layer (tools, benchmarks, examples, other layers' tests).
    for top in ("tools", "tests", "benchmarks", "examples"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".hpp", ".cpp")):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                parts = rel.split(os.sep)
                home = parts[1] if top == "tests" and len(parts) > 2 else None
                for n, _, target in scan(path)[0]:
                    m = re.match(r"accel/(\w+)/detail/", target)
                    if m and m.group(1) != home:
                        problems.append(f"{rel}:{n}: includes <{target}>, private to layer '{m.group(1)}'")

    # The entry point stays light: runtime only, no JSON library.
    seen, todo = set(), ["state.hpp"]
    while todo:
        h = todo.pop()
        if h in seen:
            continue
        seen.add(h)
        if layer_of(h) not in ("runtime", ""):
            problems.append(f"<accel/state.hpp> reaches <accel/{h}> (layer '{layer_of(h)}'); keep it to runtime/")
        for n, _, target in scan(os.path.join(inc_root, h))[0]:
            if target.startswith("nlohmann/"):
                problems.append(f"<accel/state.hpp> reaches <{target}> through include/accel/{h}:{n}")
        todo.extend(graph.get(h, []))

    if cxx:
        public = [h for h in headers if "/detail/" not in h]
        if backend_only:
            mentions = {}  # header -> whether its own text mentions the backend (each file read once)

            def backend(h, seen):
                if h in seen:
                    return False
                seen.add(h)
                if h not in mentions:
                    with open(os.path.join(inc_root, h), encoding="utf-8") as f:
                        mentions[h] = h != CONFIG and BACKEND.search(f.read()) is not None
                return mentions[h] or any(backend(d, seen) for d in graph[h])

            public = [h for h in public if h == CONFIG or backend(h, set())]

        def compile_alone(h):
            cmd = cxx + ["-x", "c++", "-fsyntax-only", "-"]
            source = f"#include <accel/{h}>\n#include <accel/{h}>\n"
            r = subprocess.run(cmd, input=source, capture_output=True, text=True)
            return None if r.returncode == 0 else f"<accel/{h}> does not compile alone:\n{r.stderr.strip()[:2000]}"

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            problems.extend(p for p in pool.map(compile_alone, public) if p)
        print(f"layout: {len(public)} public headers compiled alone"
              + (" (those that depend on CUDA or NCCL)" if backend_only else ""))

    for p in problems:
        print(p)
    print(f"layout: {len(headers)} headers checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
