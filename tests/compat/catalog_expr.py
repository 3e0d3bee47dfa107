# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""The catalog's small expression language, as the generators evaluate it. The C++ evaluator in
include/accel/model/architecture.hpp implements the same rules; keep the two in step.

  expr  := alt ('??' alt)*          a ?? b: a, unless a is missing (absent or null), then b
  alt   := term (('+' | '-') term)*
  term  := unary (('*' | '//') unary)*     // is floor division
  unary := '-' unary | '(' expr ')' | NUMBER | NAME

NAME is a dotted path into config.json (`rope_parameters.partial_rotary_factor`). A top-level
name first goes through the config class's attribute_map (GPT-2: hidden_size -> n_embd), then
config.json, then the catalog's defaults (the config class's own defaults). Arithmetic on a
missing value (and x // 0) is missing; a missing final result means "cannot compute from this
config".
"""
import math
import re

_TOKEN = re.compile(r"\s*(\?\?|//|[-+*()]|[0-9]+(?:\.[0-9]+)?|[A-Za-z_][A-Za-z0-9_.]*)")


def tokens(text):
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"bad expression {text!r} at {pos}")
        out.append(m.group(1))
        pos = m.end()
    return out


def lookup(name, config, defaults, attribute_map):
    """The value of a dotted config path, or None when missing."""
    head, _, rest = name.partition(".")
    head = attribute_map.get(head, head)
    key = head + ("." + rest if rest else "")
    for source in (config, defaults):
        value = source
        if source is defaults:
            value = defaults.get(key)
        else:
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None


def evaluate(text, config, defaults=None, attribute_map=None):
    defaults, attribute_map = defaults or {}, attribute_map or {}
    toks, pos = tokens(text), [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        pos[0] += 1
        return toks[pos[0] - 1]

    def unary():
        t = take()
        if t == "-":
            v = unary()
            return None if v is None else -v
        if t == "(":
            v = expr()
            if take() != ")":
                raise ValueError(f"missing ')' in {text!r}")
            return v
        if t[0].isdigit():
            return float(t) if "." in t else int(t)
        return lookup(t, config, defaults, attribute_map)

    def term():
        v = unary()
        while peek() in ("*", "//"):
            op, r = take(), unary()
            if v is None or r is None or (op == "//" and r == 0):
                v = None
            elif op == "*":
                v = v * r
            else:
                v = math.floor(v / r) if isinstance(v, float) or isinstance(r, float) else v // r
        return v

    def alt():
        v = term()
        while peek() in ("+", "-"):
            op, r = take(), term()
            v = None if v is None or r is None else (v + r if op == "+" else v - r)
        return v

    def expr():
        v = alt()
        while peek() == "??":
            take()
            r = alt()
            if v is None:
                v = r
        return v

    value = expr()
    if pos[0] != len(toks):
        raise ValueError(f"trailing tokens in {text!r}")
    return value
