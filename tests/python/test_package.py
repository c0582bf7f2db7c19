"""The Python package without a GPU and without torch: import, version, which route install() takes, what
`import cachalot.torch` says without torch or with one too old, and the alloc_snapshot command.

Run with the interpreter the package was installed into: python tests/python/test_package.py
A stand-in `torch` module (tests/python/fake_torch) records what install() asks of PyTorch, so the route
selection is tested where no torch can be installed; another (tests/python/fake_torch_old) is a torch
1.13.1. The build backend's tests (test_build_backend.py) run here too.
"""
import ctypes
import os
import re
import stat
import subprocess
import sys
import sysconfig
import tempfile
import types
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_torch"))

import cachalot  # noqa: E402
from test_build_backend import BuildBackend  # noqa: E402,F401 (run with these tests)


def run_python(code, args=(), pythonpath=None):
    """Runs code in a fresh interpreter (this one); (status, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, "-c", code] + list(args), env=env, capture_output=True, text=True,
                       timeout=120, cwd=tempfile.gettempdir())
    return r.returncode, r.stdout, r.stderr


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

    def test_a_bad_conf_is_refused_before_anything_is_installed(self):
        import torch

        before = os.environ.get("CACHALOT_ALLOC_CONF")
        for route in ("auto", "pluggable", "backend"):
            with self.assertRaisesRegex(ValueError, "nonsense_key"):
                self.ct.install(conf="nonsense_key:1", route=route)
            with self.assertRaisesRegex(ValueError, "max_split_size_mb"):
                self.ct.install(conf="max_split_size_mb:2", route=route)
            with self.assertRaisesRegex(TypeError, "conf must be a str"):
                self.ct.install(conf=40, route=route)
        self.assertIsNone(self.ct._route)
        self.assertEqual(torch.calls, [])
        self.assertEqual(os.environ.get("CACHALOT_ALLOC_CONF"), before)

    def test_a_second_install_with_another_conf_raises(self):
        self.ct._build.TORCH_BACKEND = False
        if not os.path.exists(cachalot.library_path("cachalot_torch")):
            self.skipTest("built without CUDA: no plug-in")
        before = os.environ.get("CACHALOT_ALLOC_CONF")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.assertEqual(self.ct.install(conf="max_split_size_mb:40"), "pluggable")
            self.assertEqual(self.ct.install(conf="max_split_size_mb:40"), "pluggable")  # the same: answers
            with self.assertRaisesRegex(RuntimeError, "already installed with conf='max_split_size_mb:40'"):
                self.ct.install(conf="max_split_size_mb:80")
        finally:
            if before is None:
                os.environ.pop("CACHALOT_ALLOC_CONF", None)
            else:
                os.environ["CACHALOT_ALLOC_CONF"] = before

    def test_without_the_plugin_neither_route_is_taken_and_it_says_why(self):
        self.ct._build.TORCH_BACKEND = False
        saved = self.ct.library_path
        self.ct.library_path = lambda name="cachalot": "/nonexistent/lib%s.so" % name
        try:
            for route in ("auto", "pluggable"):
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    with self.assertRaisesRegex(RuntimeError, re.escape(
                            "the pluggable route cannot be used either: /nonexistent/libcachalot_torch.so is "
                            "missing (this cachalot was built without the CUDA toolkit")):
                        self.ct.install(route=route)
                self.assertEqual(w, [])
                self.assertIsNone(self.ct.route())
        finally:
            self.ct.library_path = saved
        import torch

        self.assertEqual(torch.calls, [])

    def test_backend_asked_for_but_unavailable_raises(self):
        self.ct._build.TORCH_BACKEND = False
        with self.assertRaisesRegex(RuntimeError, "cannot be used: this cachalot was built without"):
            self.ct.install(route="backend")
        self.assertIsNone(self.ct.route())

    def test_other_torch_version_is_refused_by_name(self):
        self.ct._build.TORCH_BACKEND, self.ct._build.TORCH_VERSION = True, "1.0.0"
        why = self.ct.backend_unavailable()
        self.assertIn("built against torch 1.0.0", why)
        self.assertIn("this is torch 2.11.0+stand-in", why)

    def test_bad_route_name(self):
        with self.assertRaises(ValueError):
            self.ct.install(route="fast")

    def test_calls_before_install_say_so(self):
        with self.assertRaisesRegex(RuntimeError, re.escape("cachalot.torch.install() first")):
            self.ct.empty_cache()
        with self.assertRaisesRegex(RuntimeError, re.escape("cachalot.torch.install() first")):
            self.ct.annotate("phase 1")


# What `import cachalot.torch` raises: the interpreter's error type, then its message.
IMPORT_TORCH = """
import sys
%s
try:
    import cachalot.torch
except ImportError as e:
    print(type(e).__name__, e.name, isinstance(e, ModuleNotFoundError))
    print(e)
else:
    print("imported")
"""


class TorchVersions(unittest.TestCase):
    NEEDS = "cachalot.torch needs PyTorch 2.0 or newer (2.11 or newer for its backend route; tested with 2.11), "

    def test_without_torch_the_error_says_what_to_install(self):
        for hide, pythonpath in (("sys.modules['torch'] = None", os.path.join(HERE, "fake_torch")),  # hidden
                                 ("", None)):  # no stand-in on the path (and no torch on this machine)
            if not hide:
                rc, _, _ = run_python("import torch")
                if rc == 0:
                    continue  # a real torch is installed here: the first case covers it
            rc, out, err = run_python(IMPORT_TORCH % hide, pythonpath=pythonpath)
            self.assertEqual(rc, 0, err)
            kind, msg = out.splitlines()
            self.assertEqual(kind, "ModuleNotFoundError torch True")
            want = self.NEEDS + "and this Python (%s) has no torch: " % sys.executable
            self.assertTrue(msg.startswith(want), msg)
            self.assertIn("install it (`pip install torch`), then reinstall cachalot", msg)
            # and uncaught: one line of message after the traceback, no chained "No module named 'torch'"
            rc, _, err = run_python("import sys\n" + hide + "\nimport cachalot.torch", pythonpath=pythonpath)
            self.assertEqual(rc, 1)
            self.assertTrue(err.strip().splitlines()[-1].startswith("ModuleNotFoundError: " + self.NEEDS), err)
            self.assertNotIn("During handling", err)

    def test_an_old_torch_is_refused_by_version(self):
        rc, out, err = run_python(IMPORT_TORCH % "", pythonpath=os.path.join(HERE, "fake_torch_old"))
        self.assertEqual(rc, 0, err)
        kind, msg = out.splitlines()
        self.assertEqual(kind, "ImportError torch False")
        self.assertTrue(msg.startswith(self.NEEDS + "and this is torch 1.13.1 (%s): " % os.path.join(
            HERE, "fake_torch_old", "torch")), msg)
        self.assertIn("upgrade it (`pip install --upgrade torch`), then reinstall cachalot", msg)

    def test_the_stand_in_is_accepted(self):
        rc, out, err = run_python(IMPORT_TORCH % "", pythonpath=os.path.join(HERE, "fake_torch"))
        self.assertEqual((rc, out.strip()), (0, "imported"), err)

    def test_version_strings(self):
        import cachalot.torch as ct

        for text, want in (("2.11.0+cu130", (2, 11)), ("1.13.1", (1, 13)), ("2.1.0a0+git7bcf7da", (2, 1)),
                           ("2.0.0", (2, 0)), ("2.6.0.dev20241112+cu124", (2, 6)), ("10.2", (10, 2)),
                           ("unknown", None), (None, None), ("", None)):
            self.assertEqual(ct._torch_version(text), want, text)

    def test_the_gate_on_each_version(self):
        import cachalot.torch as ct

        saved = sys.modules.get("torch")
        api = types.SimpleNamespace(memory=types.SimpleNamespace(CUDAPluggableAllocator=object))
        cases = (("2.11.0+cu130", api, True), ("2.0.0", api, True), ("2.1.0a0+git1234", api, True),
                 ("1.13.1", api, False), ("0.4.1", None, False), ("1.9.0+cu111", None, False),
                 ("weird", api, True), ("weird", None, False))  # (version, torch.cuda, accepted)
        try:
            for version, cuda, ok in cases:
                fake = types.ModuleType("torch")
                fake.__version__, fake.__file__ = version, "/stand-in/torch/__init__.py"
                if cuda is not None:
                    fake.cuda = cuda
                sys.modules["torch"] = fake
                if ok:
                    self.assertIs(ct._import_torch(), fake, version)
                else:
                    want = "this is torch %s (/stand-in/torch)" % version
                    with self.assertRaisesRegex(ImportError, re.escape(want)):
                        ct._import_torch()
            sys.modules["torch"] = None
            with self.assertRaises(ModuleNotFoundError) as cm:
                ct._import_torch()
            self.assertEqual(cm.exception.name, "torch")
        finally:
            sys.modules["torch"] = saved


def _console_script():
    for folder in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = os.path.join(folder, "alloc_snapshot")
        if os.path.exists(path):
            return path
    return None


class SnapshotCommand(unittest.TestCase):
    def setUp(self):
        import cachalot.snapshot  # noqa: F401 (installed by meson.build's py.install_sources)

    def test_console_script_is_installed(self):
        self.assertIsNotNone(_console_script(), "pip installed no alloc_snapshot command in %s"
                             % sysconfig.get_path("scripts"))

    def test_the_bundled_tool_runs_or_its_absence_is_one_line(self):
        binary = cachalot.snapshot.binary_path()
        self.assertEqual(os.path.dirname(binary), os.path.dirname(cachalot.__file__))
        commands = [[sys.executable, "-m", "cachalot.snapshot"]]
        if _console_script():
            commands.append([_console_script()])
        for cmd in commands:
            r = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=60,
                               cwd=tempfile.gettempdir())
            if os.path.isfile(binary):  # built with cJSON and zlib: the tool itself answers
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("usage: alloc_snapshot", r.stdout)
                with open(binary, "rb") as f:
                    self.assertIn(b"$ORIGIN", f.read(), "alloc_snapshot has no RUNPATH $ORIGIN")
            else:
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertEqual(r.stdout, "")
                self.assertEqual(r.stderr, "alloc_snapshot: this cachalot package (%s) was built without it: "
                                 "alloc_snapshot needs libcjson-dev and zlib1g-dev at build time (apt-get install "
                                 "libcjson-dev zlib1g-dev, then pip install --no-build-isolation . again)\n"
                                 % os.path.dirname(binary))

    def run_stand_in(self, script, mode, args):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "alloc_snapshot")
            with open(path, "w") as f:
                f.write(script)
            os.chmod(path, mode)
            return run_python("import sys, cachalot.snapshot as s\ns.binary_path = lambda: %r\nsys.exit(s.main())"
                              % path, args)

    def test_arguments_and_exit_status_pass_through(self):
        rc, out, err = self.run_stand_in('#!/bin/sh\nprintf "%s|" "$@"\nexit 7\n', 0o755,
                                         ["show", "a b.json", "--x"])
        self.assertEqual((rc, out, err), (7, "show|a b.json|--x|", ""))
        rc, out, err = self.run_stand_in("#!/bin/sh\nexit 0\n", 0o755, [])
        self.assertEqual((rc, out, err), (0, "", ""))

    def test_a_tool_that_cannot_run_is_one_line(self):
        rc, out, err = self.run_stand_in("#!/bin/sh\n", stat.S_IRUSR | stat.S_IWUSR, ["show"])
        self.assertEqual(rc, 1)
        self.assertRegex(err, r"^alloc_snapshot: \S+/alloc_snapshot is not executable\n$")
        rc, out, err = self.run_stand_in("#!/nonexistent/interpreter\n", 0o755, ["show"])
        self.assertEqual(rc, 1)
        self.assertRegex(err, r"^alloc_snapshot: cannot run \S+/alloc_snapshot: No such file or directory\n$")


if __name__ == "__main__":
    unittest.main(verbosity=2)
