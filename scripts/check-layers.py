#!/usr/bin/env python3
"""Fails when a folder includes one above it in kvbench's layer order (cmake/layers.txt).

Every C++ source under the tree (.h .hpp .cpp .cc .cu .cuh, and *.cpp.in templates) must belong to a
layer, and each of its `#include "..."` lines that names a file of the tree must name one of its own
layer or of a lower one. Each violation is printed as

    path/to/file.cpp:12: layer harness includes methods/x/y.h of layer methods (higher)

and the exit status is 1; a file in no layer, or a layers file that cannot be read, is reported the
same way. Includes that resolve to no file of the tree (system and third-party headers, generated
files) are not checked. Standard library only: ctest runs it on machines without LibTorch's Python.

Usage: check-layers.py [--root DIR] [--layers FILE]    (defaults: the checkout, DIR/cmake/layers.txt)
"""

import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".cpp.in")
SKIPPED_DIRS = {".git", "third_party"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


class LayersError(Exception):
    pass


def parse_layers(path):
    """Returns (layers: [(name, [paths])], include_dirs: [dirs], allowed: {(file, included)},
    forbidden: [(from path, to path)])."""
    layers, include_dirs, allowed, forbidden = [], [], set(), []
    seen_paths = {}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        raise LayersError(f"{path}: cannot read the layers file: {e.strerror}")
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include_dir:"):
            include_dirs.extend(line[len("include_dir:"):].split())
        elif line.startswith("layer "):
            head, sep, rest = line[len("layer "):].partition(":")
            name, paths = head.strip(), [p.strip("/") for p in rest.split()]
            if not sep or not name or not paths:
                raise LayersError(f"{path}:{n}: expected 'layer <name>: <folder> ...'")
            if any(name == existing for existing, _ in layers):
                raise LayersError(f"{path}:{n}: layer {name} is defined twice")
            for p in paths:
                if p in seen_paths:
                    raise LayersError(f"{path}:{n}: {p} is already in layer {seen_paths[p]}")
                seen_paths[p] = name
            layers.append((name, paths))
        elif line.startswith("allow "):
            src, arrow, dst = line[len("allow "):].partition("->")
            if not arrow or not src.strip() or not dst.strip():
                raise LayersError(f"{path}:{n}: expected 'allow <file> -> <included file>'")
            allowed.add((src.strip(), dst.strip()))
        elif line.startswith("forbid "):
            src, arrow, dst = line[len("forbid "):].partition("->")
            if not arrow or not src.strip() or not dst.strip():
                raise LayersError(f"{path}:{n}: expected 'forbid <folder> -> <folder>'")
            forbidden.append((src.strip().strip("/"), dst.strip().strip("/")))
        else:
            raise LayersError(f"{path}:{n}: not a layer, include_dir, allow or forbid line: "
                              f"{raw.strip()}")
    if not layers:
        raise LayersError(f"{path}: no layers defined")
    if not include_dirs:
        include_dirs = ["."]
    return layers, include_dirs, allowed, forbidden


def under(relpath, folder):
    return relpath == folder or relpath.startswith(folder + "/")


def layer_of(relpath, layers):
    """(index, name) of the layer whose longest path is relpath or a folder above it; None if none."""
    best = None
    for index, (name, paths) in enumerate(layers):
        for p in paths:
            if p in (".", "") or relpath == p or relpath.startswith(p + "/"):
                length = 0 if p in (".", "") else len(p)
                if best is None or length > best[0]:
                    best = (length, index, name)
    return None if best is None else (best[1], best[2])


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        # Build trees (anything holding a CMakeCache.txt) and VCS data are not sources.
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in SKIPPED_DIRS and not d.startswith("build")
            and not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt")))
        for f in sorted(filenames):
            if f.endswith(SOURCE_SUFFIXES):
                rel = os.path.normpath(os.path.join(rel_dir, f))
                yield rel.replace(os.sep, "/")


def resolve(root, includer, target, include_dirs):
    """The tree-relative path `#include "target"` in `includer` names, or None (not in the tree)."""
    candidates = [os.path.join(os.path.dirname(includer), target)]
    candidates += [os.path.join(d, target) for d in include_dirs]
    for c in candidates:
        full = os.path.normpath(os.path.join(root, c))
        if os.path.isfile(full):
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if not rel.startswith("../"):
                return rel
    return None


def check(root, layers_path):
    """Returns the list of problems (strings); empty when the tree keeps the order."""
    layers, include_dirs, allowed, forbidden = parse_layers(layers_path)
    problems = []
    for rel in source_files(root):
        own = layer_of(rel, layers)
        if own is None:
            problems.append(f"{rel}: in no layer of {os.path.relpath(layers_path, root)} "
                            "(add its folder to a layer)")
            continue
        try:
            text = open(os.path.join(root, rel), encoding="utf-8", errors="replace").read()
        except OSError as e:
            problems.append(f"{rel}: cannot read: {e.strerror}")
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = resolve(root, rel, m.group(1), include_dirs)
            if target is None:
                continue
            theirs = layer_of(target, layers)
            if theirs is None:
                continue  # reported as a file in no layer when the walk reaches it
            if (rel, target) in allowed:
                continue
            if theirs[0] > own[0]:
                problems.append(f"{rel}:{n}: layer {own[1]} includes {target} of layer {theirs[1]} "
                                f"(higher; the order is {' < '.join(name for name, _ in layers)})")
            for src, dst in forbidden:
                if under(rel, src) and under(target, dst):
                    problems.append(f"{rel}:{n}: {src} must not include {dst} (forbidden in "
                                    f"{os.path.basename(layers_path)}), but includes {target}")
    return problems


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(here), help="the source tree")
    ap.add_argument("--layers", help="the layer order (default: ROOT/cmake/layers.txt)")
    args = ap.parse_args(argv)
    layers_path = args.layers or os.path.join(args.root, "cmake", "layers.txt")
    try:
        problems = check(args.root, layers_path)
    except LayersError as e:
        print(f"check-layers: {e}", file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check-layers: {len(problems)} problem(s); the order is written in {layers_path}",
              file=sys.stderr)
        return 1
    print("check-layers: every include goes down the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
