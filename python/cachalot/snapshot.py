"""The `alloc_snapshot` command: the snapshot tool (tools/alloc_snapshot, docs/tools.md) bundled in this
package, run with the same arguments and exit status.

    alloc_snapshot plot oom.json -o oom.html         # the console script pip installs
    python -m cachalot.snapshot summary rank*.json   # the same

The build puts the tool beside the package's files where cJSON and zlib were found (libcjson-dev,
zlib1g-dev); without them the package has no tool and the command says so in one line (exit status 1).
"""
import os
import sys

__all__ = ["binary_path", "main"]

_NAME = "alloc_snapshot"


def binary_path():
    """Where the bundled alloc_snapshot is (whether or not this installation has it)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _NAME)


def main(argv=None):
    """Runs the bundled alloc_snapshot in place of this process with argv (default: the command line's
    arguments); returns 1, after one line on standard error, where it cannot."""
    args = sys.argv[1:] if argv is None else list(argv)
    path = binary_path()
    if not os.path.isfile(path):
        why = ("this cachalot package (%s) was built without it: alloc_snapshot needs libcjson-dev and "
               "zlib1g-dev at build time (apt-get install libcjson-dev zlib1g-dev, then "
               "pip install --no-build-isolation . again)" % os.path.dirname(path))
    elif not os.access(path, os.X_OK):
        why = "%s is not executable" % path
    else:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(path, [_NAME] + args)  # does not return: the tool's exit status is the command's
        except OSError as e:
            why = "cannot run %s: %s" % (path, e.strerror or e)
    print("alloc_snapshot: %s" % why, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
