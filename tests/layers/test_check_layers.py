#!/usr/bin/env python3
"""scripts/check-layers.py on small made-up trees: a tree that keeps the order passes, and each way
of breaking it (a lower layer including a higher one, through the root, an include directory or a
relative path; a file in no layer; a malformed layers file) fails naming the place. Standard library
only (ctest: layer_order_checker)."""

import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                       "check-layers.py")

LAYERS = """\
include_dir: . base/include
layer base: base
layer mid: mid
layer top: top
"""


class CheckLayers(unittest.TestCase):
    def make_tree(self, files, layers=LAYERS):
        root = tempfile.mkdtemp(prefix="kvb_layers_")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", root], check=False))
        files = dict(files)
        files.setdefault("cmake/layers.txt", layers)
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return root

    def run_checker(self, root):
        r = subprocess.run([sys.executable, CHECKER, "--root", root], capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr

    GOOD = {
        "base/include/b/util.h": "#pragma once\n",
        "base/util.cpp": '#include "b/util.h"\n#include <vector>\n',
        "mid/engine.h": '#pragma once\n#include "base/include/b/util.h"\n',
        "mid/engine.cpp": '#include "mid/engine.h"\n#include "engine.h"\n',
        "top/main.cpp": '#include "mid/engine.h"\n#include "b/util.h"\n#include "generated/none.h"\n',
    }

    def test_a_tree_that_keeps_the_order_passes(self):
        rc, out = self.run_checker(self.make_tree(self.GOOD))
        self.assertEqual(rc, 0, out)
        self.assertIn("every include goes down the layer order", out)

    def test_a_lower_layer_including_a_higher_one_fails_naming_file_line_and_layers(self):
        tree = dict(self.GOOD)
        tree["base/util.cpp"] = '#include "b/util.h"\n\n#include "mid/engine.h"\n'
        rc, out = self.run_checker(self.make_tree(tree))
        self.assertEqual(rc, 1, out)
        self.assertIn("base/util.cpp:3: layer base includes mid/engine.h of layer mid (higher", out)
        self.assertIn("1 problem(s)", out)

    def test_violations_through_relative_paths_and_include_dirs_are_found(self):
        tree = dict(self.GOOD)
        tree["mid/engine.cpp"] = '#include "../top/feature.h"\n'
        tree["top/feature.h"] = "#pragma once\n"
        tree["base/include/b/bad.h"] = '  #  include "mid/engine.h"\n'
        tree["base/user.cpp"] = '#include "b/bad.h"\n'
        rc, out = self.run_checker(self.make_tree(tree))
        self.assertEqual(rc, 1, out)
        self.assertIn("mid/engine.cpp:1: layer mid includes top/feature.h of layer top", out)
        self.assertIn("base/include/b/bad.h:1: layer base includes mid/engine.h of layer mid", out)
        self.assertNotIn("base/user.cpp", out)  # b/bad.h is base's own
        self.assertIn("2 problem(s)", out)

    def test_a_file_in_no_layer_fails(self):
        tree = dict(self.GOOD)
        tree["stray/thing.cpp"] = '#include "mid/engine.h"\n'
        rc, out = self.run_checker(self.make_tree(tree))
        self.assertEqual(rc, 1, out)
        self.assertIn("stray/thing.cpp: in no layer", out)

    def test_an_allow_line_exempts_one_include_only(self):
        tree = dict(self.GOOD)
        tree["base/util.cpp"] = '#include "mid/engine.h"\n#include "top/x.h"\n'
        tree["top/x.h"] = ""
        layers = LAYERS + "# the reason, for the reader\nallow base/util.cpp -> mid/engine.h\n"
        rc, out = self.run_checker(self.make_tree(tree, layers))
        self.assertEqual(rc, 1, out)
        self.assertNotIn("mid/engine.h of layer mid", out)
        self.assertIn("base/util.cpp:2: layer base includes top/x.h of layer top", out)

    def test_a_forbidden_dependency_fails_even_downwards(self):
        layers = LAYERS + "forbid top -> mid/private\n"
        tree = dict(self.GOOD)
        tree["mid/private/detail.h"] = ""
        tree["top/main.cpp"] = '#include "mid/engine.h"\n#include "mid/private/detail.h"\n'
        rc, out = self.run_checker(self.make_tree(tree, layers))
        self.assertEqual(rc, 1, out)
        self.assertIn("top/main.cpp:2: top must not include mid/private", out)
        self.assertNotIn("top/main.cpp:1", out)  # the rest of mid stays allowed

    def test_the_longest_layer_path_decides(self):
        layers = LAYERS + "layer inner_top: base/plugins\n"
        tree = dict(self.GOOD)
        tree["base/plugins/p.cpp"] = '#include "top/x.h"\n'  # base/plugins is above top
        tree["top/x.h"] = ""
        tree["base/oops.cpp"] = '#include "base/plugins/p.cpp"\n'
        rc, out = self.run_checker(self.make_tree(tree, layers))
        self.assertEqual(rc, 1, out)
        self.assertNotIn("base/plugins/p.cpp:1", out)
        self.assertIn("base/oops.cpp:1: layer base includes base/plugins/p.cpp of layer inner_top", out)

    def test_a_malformed_or_missing_layers_file_fails(self):
        for layers, needle in [("layer base base\n", "expected 'layer <name>"),
                               (LAYERS + "forbid top\n", "expected 'forbid <folder> -> <folder>'"),
                               ("layer a: x\nlayer b: x\n", "x is already in layer a"),
                               ("bogus line\n", "not a layer"),
                               ("# nothing\n", "no layers defined")]:
            rc, out = self.run_checker(self.make_tree(self.GOOD, layers))
            self.assertEqual(rc, 1, out)
            self.assertIn(needle, out)
        root = self.make_tree(self.GOOD)
        os.remove(os.path.join(root, "cmake", "layers.txt"))
        rc, out = self.run_checker(root)
        self.assertEqual(rc, 1, out)
        self.assertIn("cannot read the layers file", out)


if __name__ == "__main__":
    unittest.main()
