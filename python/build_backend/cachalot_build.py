"""cachalot's PEP 517 build backend: meson-python's own hooks, each after a check that says in one line
what is missing (meson-python, Meson, Ninja) and how to install it, where meson-python would end in a
traceback. pyproject.toml names it (build-backend, backend-path).

An isolated build (plain `pip install .`) installs [build-system] requires first, so the check speaks
where they were not installed: `pip install --no-build-isolation .` in a Python without them. meson and
ninja installed with pip into a virtual environment that is not activated are found all the same: the
folder of this Python's scripts goes on PATH. Works with meson-python 0.12 (Debian 12) and later."""
import os
import shlex
import shutil
import sys
import sysconfig

try:
    import mesonpy as _mesonpy
except ImportError as e:  # not installed, or one of its own imports missing
    _mesonpy, _mesonpy_error = None, e
else:
    _mesonpy_error = None

# PEP 517 and PEP 660 hooks: the ones meson-python has are passed on (pip falls back on build_wheel for
# the optional ones it lacks); without meson-python each one stops with the message.
_HOOKS = ("get_requires_for_build_wheel", "get_requires_for_build_sdist", "get_requires_for_build_editable",
          "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable", "build_wheel", "build_sdist",
          "build_editable")


def _script_dirs():
    """Where pip puts this Python's commands: beside the interpreter (a venv's bin), the scheme's scripts
    folder, the user scheme's (pip install --user)."""
    dirs = [os.path.dirname(os.path.abspath(sys.executable))] if sys.executable else []
    for scheme in (None, os.name + "_user"):
        try:
            dirs.append(sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts"))
        except (KeyError, ValueError):
            pass
    return [d for d in dirs if d and os.path.isdir(d)]


def _find(names, env_var):
    """The tool named by $env_var, else the first of names on PATH, else in this Python's scripts folders
    (which then go on PATH, for meson-python and Meson to find it there too); None where none is."""
    given = os.environ.get(env_var)
    if given:
        return shutil.which(given) or (given if os.path.isfile(given) else None)
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    for folder in _script_dirs():
        for name in names:
            path = shutil.which(name, path=folder)
            if path:
                os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
                return path
    return None


def _check(need_ninja):
    missing = []
    if _mesonpy is None:
        name = getattr(_mesonpy_error, "name", None)
        missing.append("meson-python" if name in (None, "mesonpy") else
                       "meson-python (it cannot import %s: %s)" % (name, _mesonpy_error))
    if _find(["meson"], "MESON") is None:
        missing.append("meson")
    # Ninja is what get_requires_for_build_* report as needed (an isolated build installs it then).
    if need_ninja and _find(["ninja", "ninja-build", "samu"], "NINJA") is None:
        missing.append("ninja")
    if not missing:
        return
    python = shlex.quote(sys.executable or "python3")
    sys.stdout.flush()
    what = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
    sys.stderr.write(
        "cachalot: cannot build: %s %s missing (for the Python %s); install with `%s -m pip install "
        "meson-python meson ninja` (Debian's system python, or a venv made with --system-site-packages: "
        "`apt-get install python3-mesonpy`), then run `pip install --no-build-isolation .` again\n"
        % (what, "is" if len(missing) == 1 else "are", python, python))
    sys.stderr.flush()
    raise SystemExit(1)  # not an exception: pip would print its traceback under the line


def _hook(name):
    def hook(*args, **kwargs):
        _check(need_ninja=not name.startswith("get_requires"))
        return getattr(_mesonpy, name)(*args, **kwargs)

    hook.__name__ = hook.__qualname__ = name
    return hook


for _name in _HOOKS:
    if _mesonpy is None or hasattr(_mesonpy, _name):
        globals()[_name] = _hook(_name)
del _name
