#!/usr/bin/env python3
"""scripts/check-function-length.py on small made-up trees: short functions pass; a long one fails
naming file:line; listed at its length it passes; grown past its listed length, or listed while no
longer long, it fails; braces in strings, comments, lambdas, control blocks and class scopes are
read as what they are. Standard library only (ctest: function_length_checker)."""

import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                       "check-function-length.py")


def function(name, body_lines, indent=""):
    body = "".join('%s  x += "{";  // }\n' % indent for _ in range(body_lines))
    return "%svoid %s(int x) {\n%s%s}\n" % (indent, name, body, indent)


class CheckFunctionLength(unittest.TestCase):
    def run_on(self, files):
        root = tempfile.mkdtemp(prefix="kvb_fnlen_")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", root], check=False))
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        r = subprocess.run([sys.executable, CHECKER, "--root", root, "--limit", "10"],
                           capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr

    def test_short_functions_pass(self):
        code, out = self.run_on({"harness/a.cpp": "namespace kvb {\n" + function("f", 8) + "}\n"})
        self.assertEqual(code, 0, out)

    def test_a_long_function_fails_naming_it(self):
        src = "namespace kvb {\nnamespace {\n" + function("g", 3) + "}\n" + function("long_one", 12) + "}\n"
        code, out = self.run_on({"harness/a.cpp": src})
        self.assertEqual(code, 1, out)
        self.assertIn("harness/a.cpp:9: long_one is 14 lines", out)

    def test_members_lambdas_and_control_blocks(self):
        body = "  if (x) {\n" + "    auto l = [&]() {\n" * 1 + "    };\n  }\n" * 1
        src = ("struct S {\n" + function("S::m", 12, "  ") + "};\n" +
               "void h() {\n" + body * 4 + "}\n")
        code, out = self.run_on({"datasets/b.cpp": src})
        self.assertEqual(code, 1, out)
        self.assertIn("S::m is 14 lines", out)
        self.assertIn("h is 18 lines", out)

    def test_the_list_allows_no_growth_and_no_stale_lines(self):
        src = {"harness/a.cpp": function("long_one", 12)}
        code, out = self.run_on(dict(src, **{"cmake/long-functions.txt": "harness/a.cpp:long_one 14\n"}))
        self.assertEqual(code, 0, out)
        code, out = self.run_on(dict(src, **{"cmake/long-functions.txt": "harness/a.cpp:long_one 13\n"}))
        self.assertEqual(code, 1, out)
        self.assertIn("grew to 14 lines", out)
        code, out = self.run_on({"harness/a.cpp": function("long_one", 5),
                                 "cmake/long-functions.txt": "harness/a.cpp:long_one 14\n"})
        self.assertEqual(code, 1, out)
        self.assertIn("no longer over the limit", out)

    def test_tests_and_kernels_are_not_checked(self):
        code, out = self.run_on({"tests/t.cpp": function("t", 30), "kernels/k.cpp": function("k", 30)})
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
