#!/usr/bin/env python3
"""PyTorch's own CUDA-allocator tests, natively and under cachalot, in fresh processes.

    python3 tests/gpu/pytorch_suite.py TESTS_DIR OUT_DIR [--modes native,cachalot] [--files a.py,b.py]

TESTS_DIR holds test files from PyTorch's repository, `test/` of the release that matches the installed
torch (e.g. for torch 2.11: `git clone --depth 1 --branch v2.11.0 https://github.com/pytorch/pytorch` and
copy test/test_cuda.py, test_cuda_expandable_segments.py, test_cuda_trace.py and test_cuda_multigpu.py),
all from one commit: test_cuda_expandable_segments.py imports test_cuda.py's test classes by name.
They are PyTorch's code, not cachalot's: keep them in a git-ignored folder (.pytorch-tests/) and never
commit them. Their helpers (torch.testing._internal) ship with torch itself and need pytest, psutil and
expecttest; on a machine without pip access put expecttest.py (github.com/pytorch/expecttest) in
TESTS_DIR/deps/, which the runner puts on PYTHONPATH.

What runs: every test of those files whose class or name says it exercises the allocator (the words in
TOPICS: memory, stats, snapshot, history, graph, pool, record_stream, pinned, host, OOM, fraction,
expandable, trace, ...; all of test_cuda_trace.py). The selection is by topic, never by a list of names,
and OUT_DIR/selected.txt and unselected.txt list both sides so that nothing is hidden.

How: for each mode, each file runs in fresh pytest processes (test_cuda_trace.py one process per test,
as that file asks). Under "cachalot" a sitecustomize.py on PYTHONPATH calls cachalot.torch.install() at
interpreter start, so the subprocesses tests start get cachalot too. A process that crashes or hangs
loses only its current test: the rest run again in a new process.

Prints each mode's passed/failed/skipped counts and every test that passes natively and not under
cachalot; exit status 1 when there is one. OUT_DIR gets each process's log and results.json. A run too
long for one sitting splits by mode, file or test (--modes, --files, -k); --with RESULTS.json brings an
earlier run's results in for the comparison, for the tests this run did not run (--modes '' runs nothing
and only compares).

A file run as a script does more than its tests: test_cuda_expandable_segments.py turns expandable
segments on in its __main__. pytest never runs __main__, so the runner does what it does (MAIN_SETTINGS).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

FILES = ["test_cuda.py", "test_cuda_expandable_segments.py", "test_cuda_trace.py", "test_cuda_multigpu.py"]
TOPICS = re.compile(
    r"memory|mem_|stats|snapshot|history|graph|pool|record_stream|pin|host|oom|out_of_memory|fraction|"
    r"expandable|alloc|cach|trace|callback|segment|block|profiler|viz|plot|ipc|empty|reserved|peak|"
    r"stream_event|checkpoint|reclaim|release", re.I)
ONE_PROCESS_PER_TEST = {"test_cuda_trace.py"}
# What a file's `if __name__ == "__main__"` does before run_tests(), which pytest never runs: the settings
# it sets (and puts in PYTORCH_CUDA_ALLOC_CONF while it imports the helpers, which read it once).
MAIN_SETTINGS = {"test_cuda_expandable_segments.py": "expandable_segments:True"}
RESULT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
SITE = """\
import cachalot.torch
cachalot.torch.install()
"""
# A pytest plugin loaded before the test files: where the test files are newer than the installed torch
# (only PyTorch's repository at hand, not its release tag), the few helper names they import from
# torch.testing._internal and that torch lacks are defined as that torch's own test files define them.
# It also does what a file's __main__ does (MAIN_SETTINGS, named by the runner in PYTORCH_SUITE_MAIN), and
# stands in for the module of PyTorch's CI scripts (tools/stats) that such a __main__ imports.
# Natively and under cachalot alike; it changes no test.
COMPAT = """\
import os
import sys
import types

main_settings = os.environ.get("PYTORCH_SUITE_MAIN")
prior = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
if main_settings:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = main_settings
try:
    import torch
    import torch.testing._internal.common_utils as cu
except ImportError:  # no torch: the test files will say so themselves
    cu = None
if main_settings:  # as the file restores it after its imports
    if prior is None:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = prior
if "tools.stats.import_test_stats" not in sys.modules:
    for name in ("tools", "tools.stats", "tools.stats.import_test_stats"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["tools.stats.import_test_stats"].get_disabled_tests = lambda *args, **kwargs: None
if cu is not None and not hasattr(cu, "TEST_CUDAMALLOCASYNC"):  # test_cuda.py of 2.11 computes it itself
    cu.TEST_CUDAMALLOCASYNC = torch.cuda.is_available() and torch.cuda.get_allocator_backend() == "cudaMallocAsync"
if cu is not None and not hasattr(cu, "skipIfSandcastle"):
    # IS_SANDCASTLE is False outside Meta's CI; used bare (@skipIfSandcastle) and with a reason ("...")
    cu.skipIfSandcastle = lambda arg=None: arg if callable(arg) else (lambda fn: fn)


def pytest_sessionstart(session):
    if main_settings and cu is not None:
        torch.cuda.memory._set_allocator_settings(main_settings)
"""


def pytest(tests_dir, *args):
    """A pytest command line for the files of TESTS_DIR: no cache, the compat plugin, and test ids relative to
    TESTS_DIR whatever pytest configuration lies in the folders above it."""
    ini = os.path.join(tempfile.gettempdir(), "pytorch-suite-pytest.ini")
    if not os.path.exists(ini):
        with open(ini, "w") as f:
            f.write("[pytest]\n")
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "suite_compat", "-c", ini, "--rootdir",
            tests_dir] + list(args)


def file_env(env, name):
    return dict(env, PYTORCH_SUITE_MAIN=MAIN_SETTINGS[name]) if name in MAIN_SETTINGS else env


def collect(tests_dir, name, env):
    """The test ids pytest collects from one file."""
    env = file_env(env, name)
    p = subprocess.run(pytest(tests_dir, "--collect-only", "-q", name), cwd=tests_dir, env=env, capture_output=True,
                       text=True, timeout=600)
    ids = [line.strip() for line in p.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if not ids:
        sys.stderr.write("collecting %s found nothing:\n%s\n" % (name, (p.stdout + p.stderr)[-3000:]))
    return ids


def selected(test_id, name):
    return name in ONE_PROCESS_PER_TEST or bool(TOPICS.search(test_id.split("::", 1)[1]))


def run_batch(tests_dir, ids, env, log, timeout):
    """Runs ids in one pytest process; returns {id: outcome} for those it reached. A test that runs
    longer than `timeout` seconds (no output meanwhile) ends the process."""
    out = {}
    with open(log, "a") as f:
        f.write("$ pytest %d tests\n" % len(ids))
        f.flush()
        args = pytest(tests_dir, "-v", "-o", "console_output_style=classic", "--tb=short", "-rN", *ids)
        p = subprocess.Popen(args, cwd=tests_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        last = [time.monotonic()]
        done = threading.Event()

        def watchdog():
            while not done.wait(5):
                if time.monotonic() - last[0] > timeout:
                    f.write("\n[runner] no output for %d s: process killed\n" % timeout)
                    os.killpg(p.pid, 9)
                    return

        threading.Thread(target=watchdog, daemon=True).start()
        try:
            for line in p.stdout:
                last[0] = time.monotonic()
                f.write(line)
                m = RESULT.match(line)
                if m and m.group(1) in ids:
                    out[m.group(1)] = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped",
                                       "XFAIL": "skipped"}.get(m.group(2), "failed")
        finally:
            done.set()
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
    return out


def save(path, res):
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def run_mode(tests_dir, files, ids_of, env, outdir, mode, timeout, results, saved):
    """Fills results {id: outcome}, saved after each process so that a run cut short keeps what it had."""
    for name in files:
        ids = ids_of[name]
        log = os.path.join(outdir, "%s-%s.log" % (mode, name[:-3]))
        open(log, "w").close()
        batches = [[i] for i in ids] if name in ONE_PROCESS_PER_TEST else [ids]
        for batch in batches:
            left, empty = list(batch), 0
            while left:
                got = run_batch(tests_dir, left, file_env(env, name), log, timeout)
                results.update(got)
                saved()
                rest = [i for i in left if i not in got]
                if not rest:
                    break
                # the first test without a result is the one the process died or hung in (pytest runs the
                # ids in the order collected, which is theirs); the others run again in a new process,
                # unless processes keep dying before any result (then they all count as crashed)
                empty = 0 if got else empty + 1
                for i in (rest if empty >= 3 else rest[:1]):
                    results[i] = "crashed"
                left = [] if empty >= 3 else rest[1:]
        saved()
        sys.stdout.write("  %s %s: %d tests\n" % (mode, name, len(ids)))
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--modes", default="native,cachalot")
    ap.add_argument("--files", default=",".join(FILES))
    ap.add_argument("--timeout", type=int, default=240, help="seconds one test may run")
    ap.add_argument("-k", dest="only", default=None, help="a regular expression: run only matching selected ids")
    ap.add_argument("--with", dest="earlier", action="append", default=[],
                    help="results.json of an earlier run (another mode, another call) to compare with this one")
    a = ap.parse_args()
    tests_dir = os.path.abspath(a.tests_dir)
    outdir = os.path.abspath(a.out_dir)
    os.makedirs(outdir, exist_ok=True)
    files = [f for f in a.files.split(",") if os.path.exists(os.path.join(tests_dir, f))]
    if not files:
        sys.exit("pytorch_suite: none of %s in %s (see this script's header for how to get them)" % (a.files, tests_dir))
    base = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CACHALOT_ALLOC_CONF"):
        base.pop(k, None)
    base["PYTHONUNBUFFERED"] = "1"
    deps = os.path.join(tests_dir, "deps")  # PyTorch's test-only modules (expecttest) where pip cannot reach
    if os.path.isdir(deps):
        base["PYTHONPATH"] = os.pathsep.join(p for p in (deps, base.get("PYTHONPATH")) if p)
    compat = tempfile.mkdtemp(prefix="suite-compat-")
    with open(os.path.join(compat, "suite_compat.py"), "w") as f:
        f.write(COMPAT)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (compat, base.get("PYTHONPATH")) if p)
    site = tempfile.mkdtemp(prefix="cachalot-site-")
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITE)
    envs = {"native": dict(base),
            "cachalot": dict(base, PYTHONPATH=os.pathsep.join(p for p in (site, base.get("PYTHONPATH")) if p))}

    ids_of, unselected = {}, []
    for name in files:
        ids = collect(tests_dir, name, envs["native"])
        ids_of[name] = [i for i in ids if selected(i, name) and (not a.only or re.search(a.only, i))]
        unselected += [i for i in ids if not selected(i, name)]
    with open(os.path.join(outdir, "selected.txt"), "w") as f:
        f.write("".join(i + "\n" for n in files for i in ids_of[n]))
    with open(os.path.join(outdir, "unselected.txt"), "w") as f:
        f.write("".join(i + "\n" for i in unselected))
    print("pytorch_suite: %d tests selected from %s (%d not about the allocator: unselected.txt)"
          % (sum(len(v) for v in ids_of.values()), ", ".join(files), len(unselected)))

    res = {}
    for mode in [m for m in a.modes.split(",") if m]:
        res[mode] = {}
        run_mode(tests_dir, files, ids_of, envs[mode], outdir, mode, a.timeout, res[mode],
                 lambda: save(os.path.join(outdir, "results.json"), res))
    for path in a.earlier:  # earlier runs' results, where this run has none of its own for a test
        with open(path) as f:
            for mode, r in json.load(f).items():
                res[mode] = dict(r, **res.get(mode, {}))
    for mode, r in res.items():
        counts = {k: sum(1 for v in r.values() if v == k) for k in ("passed", "failed", "crashed", "skipped")}
        print("%-8s passed %d, failed %d, crashed %d, skipped %d" % (
            mode, counts["passed"], counts["failed"], counts["crashed"], counts["skipped"]))
    if "native" in res and "cachalot" in res:
        worse = sorted(i for i, v in res["native"].items() if v == "passed" and res["cachalot"].get(i) != "passed")
        better = sorted(i for i, v in res["cachalot"].items() if v == "passed" and res["native"].get(i) != "passed")
        for i in worse:
            print("passes natively, not under cachalot (%s): %s" % (res["cachalot"].get(i, "not run"), i))
        for i in better:
            print("passes under cachalot, not natively (%s): %s" % (res["native"].get(i, "not run"), i))
        print("pytorch_suite: %d tests pass natively and not under cachalot" % len(worse))
        return 1 if worse else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
