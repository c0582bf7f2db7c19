"""The Python package without a GPU and without torch: import, version, and which route install() takes.

Run with the interpreter the package was installed into: python tests/python/test_package.py
A stand-in `torch` module (tests/python/fake_torch) records what install() asks of PyTorch, so the route
selection is tested where no torch can be installed.
"""
import ctypes
import os
import re
import sys
import unittest
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_torch"))

import cachalot  # noqa: E402


class Package(unittest.TestCase):
    def test_version_matches_the_library(self):
        self.assertRegex(cachalot.__version__, r"^\d+\.\d+\.\d+$")
        self.assertEqual(cachalot.__version__, cachalot.version())

    def test_bundled_library_is_found_beside_the_package(self):
        self.assertTrue(cachalot.library_path().endswith("libcachalot.so." + cachalot.__version__.split(".")[0]))
        lib = ctypes.CDLL(cachalot.library_path())
        self.assertEqual(os.path.dirname(cachalot.library_path()), os.path.dirname(cachalot.__file__))
        lib.cachalot_status_name.restype = ctypes.c_char_p
        self.assertEqual(lib.cachalot_status_name(1), b"CACHALOT_ERROR_OUT_OF_MEMORY")

    def test_plugins_find_the_library_through_runpath(self):
        for name in ("cachalot_torch", "cachalot_torch_backend"):
            path = cachalot.library_path(name)
            if not os.path.exists(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            self.assertIn(b"$ORIGIN", data, name + " has no RUNPATH $ORIGIN")


class Routes(unittest.TestCase):
    def setUp(self):
        import torch  # the stand-in

        torch.calls.clear()
        import cachalot.torch as ct

        ct._route = None
        ct._handle = None
        self.ct = ct
        self.saved = (ct._build.TORCH_BACKEND, ct._build.TORCH_VERSION)

    def tearDown(self):
        self.ct._build.TORCH_BACKEND, self.ct._build.TORCH_VERSION = self.saved
        self.ct._route = None

    def test_without_backend_auto_falls_back_and_says_why(self):
        self.ct._build.TORCH_BACKEND = False
        if not os.path.exists(cachalot.library_path("cachalot_torch")):
            self.skipTest("built without CUDA: no plug-in")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.assertEqual(self.ct.install(), "pluggable")
        self.assertEqual(len(w), 1)
        self.assertIn("without the PyTorch backend", str(w[0].message))
        self.assertIn("record_stream", str(w[0].message))
        import torch

        self.assertEqual(torch.calls[0], ("CUDAPluggableAllocator", cachalot.library_path("cachalot_torch"),
                                          "cachalot_torch_malloc", "cachalot_torch_free"))
        self.assertEqual(torch.calls[1][0], "change_current_allocator")
        self.assertEqual(self.ct.route(), "pluggable")
        self.assertEqual(self.ct.install(), "pluggable")  # a second call only answers
        self.assertEqual(len(torch.calls), 2)
        with self.assertRaisesRegex(RuntimeError, "already installed on the pluggable route"):
            self.ct.install(route="backend")

    def test_backend_asked_for_but_unavailable_raises(self):
        self.ct._build.TORCH_BACKEND = False
        with self.assertRaisesRegex(RuntimeError, "cannot be used: this cachalot was built without"):
            self.ct.install(route="backend")
        self.assertIsNone(self.ct.route())

    def test_other_torch_version_is_refused_by_name(self):
        self.ct._build.TORCH_BACKEND, self.ct._build.TORCH_VERSION = True, "1.0.0"
        why = self.ct.backend_unavailable()
        self.assertIn("built against torch 1.0.0", why)
        self.assertIn("this is torch 0.0.0+stand-in", why)

    def test_bad_route_name(self):
        with self.assertRaises(ValueError):
            self.ct.install(route="fast")

    def test_calls_before_install_say_so(self):
        with self.assertRaisesRegex(RuntimeError, re.escape("cachalot.torch.install() first")):
            self.ct.empty_cache()
        with self.assertRaisesRegex(RuntimeError, re.escape("cachalot.torch.install() first")):
            self.ct.annotate("phase 1")


if __name__ == "__main__":
    unittest.main(verbosity=2)
