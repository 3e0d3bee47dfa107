#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Fails when a test's PASS_, FAIL_ or SKIP_REGULAR_EXPRESSION holds a ';'.

A test property's value is a CMake list, so a ';' splits one expression into several, and ctest
passes a test when any one of them matches: "killed rank 1; the launcher ended within 5 s" would
pass on "killed rank 1" alone. Variables set with set(NAME "...") in the same file and used in the
expression are expanded first (the stage tests build their expressions from pieces).

usage: regex_properties_check.py FILE_OR_FOLDER...   (a folder: every CMakeLists.txt and *.cmake under it)
"""
import os
import re
import sys

PROPERTY = re.compile(r'\b(PASS|FAIL|SKIP)_REGULAR_EXPRESSION\s+"((?:[^"\\]|\\.)*)"')
SET = re.compile(r'\bset\(\s*([A-Za-z0-9_]+)\s+"((?:[^"\\]|\\.)*)"\s*\)')
REFERENCE = re.compile(r'\$\{([A-Za-z0-9_]+)\}')


def expand(text, variables, depth=0):
    if depth > 8:
        return text
    return REFERENCE.sub(lambda m: expand(variables.get(m.group(1), ""), variables, depth + 1), text)


def problems(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    variables = {m.group(1): m.group(2) for m in SET.finditer(text)}
    for m in PROPERTY.finditer(text):
        expression = expand(m.group(2), variables)
        if ";" in expression:
            line = text.count("\n", 0, m.start()) + 1
            yield f"{path}:{line}: {m.group(1)}_REGULAR_EXPRESSION holds a ';' (write '.' instead): {expression[:80]}..."


def files(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, dirs, names in os.walk(p):
            dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
            for n in names:
                if n == "CMakeLists.txt" or n.endswith(".cmake"):
                    yield os.path.join(root, n)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) > 1 else 2
    found = [p for f in files(argv[1:]) for p in problems(f)]
    for p in found:
        print(p)
    print(f"regular expression properties: {len(found)} split by ';'")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
