#!/usr/bin/env python3
"""Checks that no function in the checked folders is longer than the limit (in lines, signature to
closing brace), so that a function stays short enough to read at once. Functions that are longer
today are listed in cmake/long-functions.txt with the length they have; such a function may shrink
(and leave the list) but not grow, and no other may pass the limit. Tests and kernels are exempt.

    scripts/check-function-length.py [--root DIR] [--limit N] [--list]

--list prints every function over the limit (to refresh the list after splitting one). Exits 1
naming each violation as file:line. Standard library only.
"""
import argparse
import os
import re
import sys

FOLDERS = ["harness", "datasets", "methods/common"]
LIST = "cmake/long-functions.txt"

CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|try)\b")
TYPE = re.compile(r"\b(class|struct|union|enum)\b[^()]*$")


def strip_code(text):
    """The source with comments, string and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else "") + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_preprocessor(code):
    """Preprocessor lines (with their continuations) blanked."""
    out, continued = [], False
    for line in code.split("\n"):
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        out.append("" if directive else line)
    return "\n".join(out)


def functions(path):
    """(name, first line, line count) of every function defined at namespace or class scope."""
    code = strip_preprocessor(strip_code(open(path, encoding="utf-8", errors="replace").read()))
    found = []
    stack = []  # kinds of the open braces: "scope" (namespace, type, extern) or "body"
    header, header_line, line = "", 1, 1
    for ch in code:
        if ch == "\n":
            line += 1
        if ch == "{":
            h = header.strip()
            in_scope = all(k == "scope" for k in stack)
            if in_scope and (h.startswith("namespace") or h.startswith("extern") or TYPE.search(h)):
                stack.append("scope")
            elif in_scope and ")" in h and not CONTROL.match(h) and not h.endswith("="):
                m = re.findall(r"([A-Za-z_~][A-Za-z0-9_:~<>]*)\s*\(", h)
                stack.append(("fn", m[0] if m else h[:40], header_line))
            else:
                stack.append("body")
            header = ""
        elif ch == "}":
            if stack:
                top = stack.pop()
                if isinstance(top, tuple):
                    found.append((top[1], top[2], line - top[2] + 1))
            header = ""
        elif ch == ";":
            header = ""
        else:
            if not header.strip() and not ch.isspace():
                header_line = line
            header += ch
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    allowed = {}
    list_path = os.path.join(args.root, LIST)
    if os.path.exists(list_path):
        for raw in open(list_path):
            raw = raw.split("#", 1)[0].strip()
            if raw:
                where, n = raw.rsplit(None, 1)
                allowed[where] = int(n)
    problems, seen = [], set()
    for folder in FOLDERS:
        for dirpath, _, files in sorted(os.walk(os.path.join(args.root, folder))):
            for f in sorted(files):
                if not f.endswith(".cpp"):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, args.root)
                for name, first, n in functions(path):
                    if n <= args.limit:
                        continue
                    key = "%s:%s" % (rel, name)
                    seen.add(key)
                    if args.list:
                        print("%s %d" % (key, n))
                    elif key not in allowed:
                        problems.append("%s:%d: %s is %d lines (limit %d): split it" % (rel, first, name, n, args.limit))
                    elif n > allowed[key]:
                        problems.append("%s:%d: %s grew to %d lines (listed at %d in %s): split it"
                                        % (rel, first, name, n, allowed[key], LIST))
    for key in sorted(set(allowed) - seen):
        problems.append("%s: listed in %s but no longer over the limit: remove the line" % (key, LIST))
    for p in problems:
        print("check-function-length: " + p, file=sys.stderr)
    if not args.list and not problems:
        print("check-function-length: every function within %d lines, or listed and not grown" % args.limit)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
