"""The in-tree build backend (python/build_backend/cachalot_build.py): where meson-python, meson or ninja
is missing, a build stops with one line on standard error that says which and how to install them (exit
status 1, no traceback); where they are there, it is meson-python.

Run with any python3, with or without meson-python: python tests/python/test_build_backend.py
(tests/python/test_package.py runs these tests too). The pip test makes a virtual environment without
the system's site packages (so without Debian's meson-python) and runs `pip install --no-build-isolation
--no-index .` from the checkout in it; it is skipped where the venv module cannot make one with pip.
"""
import os
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKEND_DIR = os.path.join(ROOT, "python", "build_backend")
HOOKS = ("get_requires_for_build_wheel", "get_requires_for_build_sdist", "get_requires_for_build_editable",
         "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable", "build_wheel", "build_sdist",
         "build_editable")

sys.path.insert(0, BACKEND_DIR)
import cachalot_build  # noqa: E402

try:
    import mesonpy
except ImportError:
    mesonpy = None


def _clean_env(**extra):
    drop = ("PYTHONPATH", "MESON", "NINJA", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def run_hook(hook, args=(), hide_mesonpy=False, **env):
    """Calls one hook of the backend in a fresh interpreter, as pip's hook runner does; (status, stdout,
    stderr)."""
    code = ("import sys\n"
            + ("sys.modules['mesonpy'] = None\n" if hide_mesonpy else "")
            + "sys.path.insert(0, %r)\nimport cachalot_build\nprint(cachalot_build.%s(*%r))\n"
            % (BACKEND_DIR, hook, tuple(args)))
    r = subprocess.run([sys.executable, "-c", code], env=_clean_env(**env), capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    return r.returncode, r.stdout, r.stderr


class BuildBackend(unittest.TestCase):
    def assert_one_line(self, rc, err, missing):
        self.assertEqual(rc, 1, err)
        self.assertNotIn("Traceback", err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        line = lines[0]
        self.assertTrue(line.startswith("cachalot: cannot build: %s missing (for the Python " % missing), line)
        self.assertIn("-m pip install meson-python meson ninja`", line)
        self.assertIn("apt-get install python3-mesonpy", line)
        self.assertIn("pip install --no-build-isolation .", line)
        return line

    def test_without_meson_python_every_hook_says_so_in_one_line(self):
        for hook in HOOKS:
            with self.subTest(hook=hook):
                args = () if hook.startswith("get_requires") else (tempfile.gettempdir(),)
                rc, _, err = run_hook(hook, args, hide_mesonpy=True)
                line = self.assert_one_line(rc, err, "meson-python is")
                self.assertIn(sys.executable, line)

    def test_every_missing_tool_is_named(self):
        rc, _, err = run_hook("build_wheel", (tempfile.gettempdir(),), hide_mesonpy=True,
                              MESON="/nonexistent/meson", NINJA="/nonexistent/ninja")
        self.assert_one_line(rc, err, "meson-python, meson and ninja are")

    @unittest.skipIf(mesonpy is None, "meson-python is not installed here")
    def test_with_meson_python_missing_meson_and_ninja_are_named(self):
        rc, _, err = run_hook("build_wheel", (tempfile.gettempdir(),), MESON="/nonexistent/meson",
                              NINJA="/nonexistent/ninja")
        self.assert_one_line(rc, err, "meson and ninja are")
        # get_requires_for_build_wheel is where meson-python reports ninja as needed: only meson is checked
        rc, _, err = run_hook("get_requires_for_build_sdist", (), MESON="/nonexistent/meson",
                              NINJA="/nonexistent/ninja")
        self.assert_one_line(rc, err, "meson is")

    @unittest.skipIf(mesonpy is None, "meson-python is not installed here")
    def test_with_meson_python_the_hooks_are_its_own(self):
        ours = {h for h in HOOKS if hasattr(cachalot_build, h)}
        self.assertEqual(ours, {h for h in HOOKS if hasattr(mesonpy, h)})
        self.assertIn("build_wheel", ours)
        if cachalot_build._find(["ninja", "ninja-build", "samu"], "NINJA") is None:
            self.skipTest("no ninja here")
        rc, out, err = run_hook("get_requires_for_build_sdist")
        self.assertEqual((rc, out.strip()), (0, "[]"), err)  # meson-python's answer where ninja is found

    def test_tools_in_this_pythons_scripts_folder_go_on_path(self):
        saved_dirs, saved_path = cachalot_build._script_dirs, os.environ.get("PATH", "")
        with tempfile.TemporaryDirectory() as d:
            tool = os.path.join(d, "cachalot-test-tool")
            with open(tool, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(tool, os.stat(tool).st_mode | stat.S_IXUSR)
            try:
                cachalot_build._script_dirs = lambda: [d]
                self.assertEqual(cachalot_build._find(["cachalot-test-tool"], "CACHALOT_TEST_UNSET"), tool)
                self.assertEqual(os.environ["PATH"].split(os.pathsep)[0], d)
                cachalot_build._script_dirs = lambda: []
                self.assertIsNone(cachalot_build._find(["cachalot-test-tool-absent"], "CACHALOT_TEST_UNSET"))
            finally:
                cachalot_build._script_dirs = saved_dirs
                os.environ["PATH"] = saved_path

    def test_pyproject_names_this_backend_and_keeps_the_requirements(self):
        with open(os.path.join(ROOT, "pyproject.toml")) as f:
            text = f.read()
        self.assertIn('build-backend = "cachalot_build"', text)
        self.assertIn('backend-path = ["python/build_backend"]', text)
        self.assertIn('"meson-python>=0.12"', text)

    def test_pip_without_meson_python_prints_the_line(self):
        base = getattr(sys, "_base_executable", None) or sys.executable
        with tempfile.TemporaryDirectory() as d:
            venv = os.path.join(d, "venv")
            r = subprocess.run([base, "-m", "venv", venv], env=_clean_env(), capture_output=True, text=True,
                               timeout=300)
            pip = os.path.join(venv, "bin", "pip")
            if r.returncode != 0 or not os.path.exists(pip):
                self.skipTest("%s -m venv makes no venv with pip here: %s" % (base, r.stderr.strip()[-200:]))
            r = subprocess.run([pip, "install", "--no-build-isolation", "--no-index", ROOT],
                               env=_clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"), capture_output=True, text=True,
                               timeout=300, cwd=d)
        out = r.stdout + r.stderr
        self.assertNotEqual(r.returncode, 0, out)
        self.assertIn("cachalot: cannot build: meson-python is missing (for the Python %s"
                      % os.path.join(venv, "bin"), out)
        self.assertIn("pip install meson-python meson ninja", out)
        self.assertNotIn("No module named 'mesonpy'", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
