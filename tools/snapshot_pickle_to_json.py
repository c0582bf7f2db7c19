#!/usr/bin/env python3
"""Converts a PyTorch memory snapshot pickle to the JSON that alloc_snapshot reads.

    snapshot_pickle_to_json.py IN.pickle [OUT.json]

PyTorch saves snapshots as pickles (``pickle.dump(torch.cuda.memory._snapshot(), f)``, which is what
``torch.cuda.memory._dump_snapshot()`` writes). This script turns one into JSON without importing torch:
IN may be gzip'ed ('-' reads standard input); OUT is standard output when absent or '-', gzip'ed when
it ends in '.gz', and otherwise written beside its final name and renamed onto it (never half written).

Safety: a pickle can name any Python callable, and unpickling calls it. This script unpickles with a
restricted Unpickler whose find_class refuses every global and which has no persistent_load, so only
plain data can come out (dict, list, tuple, set, str, int, float, bool, None); a pickle that names a
class or function (os.system, torch.Storage, ...) is refused before anything is called. A snapshot holds
plain data only, so nothing of a real one is lost.

Tuples and sets become JSON arrays; int dictionary keys become strings (as JSON requires); NaN and the
infinities become null (JSON has no such numbers) and are counted on stderr; bytes are refused. Shared
or self-referencing objects (which a hand-made pickle can hold) are refused or bounded: a cycle is an
error and the output stops at MAX_NODES values.

Exit status: 0 success, 1 bad input (not a pickle, a refused global, not a snapshot, unreadable or
unwritable file), 2 usage error.
"""

import gzip
import io
import json
import math
import os
import pickle
import sys
import tempfile

MAX_INPUT_BYTES = 1 << 30  # after decompression, as alloc_snapshot's reader
MAX_NODES = 50_000_000  # values written out: a pickle of shared lists cannot blow up into terabytes
MAX_DEPTH = 200  # nesting (a snapshot is about 6 deep)

PROG = "snapshot_pickle_to_json"


class Refused(Exception):
    """The input is not what this script converts; the message says why."""


class DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain data only: every global (class, function) is refused."""

    def find_class(self, module, name):
        raise Refused(f"the pickle names the global {module}.{name}: refused (only plain data is unpickled, "
                      f"nothing is called)")


def read_input(path):
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise Refused(f"cannot read: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
                raw = g.read(MAX_INPUT_BYTES + 1)
        except (OSError, EOFError) as e:
            raise Refused(f"bad gzip data: {e}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise Refused(f"larger than {MAX_INPUT_BYTES} bytes (decompressed)")
    if not raw:
        raise Refused("empty file")
    return raw


def unpickle(raw):
    try:
        return DataOnlyUnpickler(io.BytesIO(raw)).load()
    except Refused:
        raise
    except RecursionError:
        raise Refused("not a usable pickle: nested too deeply") from None
    except MemoryError:
        raise Refused("not a usable pickle: out of memory while reading it") from None
    except Exception as e:  # UnpicklingError, EOFError, KeyError, ValueError, ... all mean a bad pickle
        # Python's own wording varies between versions (and says little): only the kind is told.
        if isinstance(e, EOFError) or "truncated" in str(e):
            raise Refused("not a whole pickle: the data ends early (truncated file?)") from None
        raise Refused("not a pickle, or a damaged one") from None


def where(trail):
    """A readable path to the value being looked at ("$.segments[3].blocks[0]"), cut short if long."""
    text = "$" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in trail)
    return text if len(text) <= 120 else text[:50] + " ... " + text[-60:]


def check_shape(data):
    """Refuses cycles and data that would expand beyond MAX_NODES values or MAX_DEPTH levels once its
    shared objects are written out one copy per reference (a pickle of a list holding the same list a
    thousand times, five levels deep, is a few KB that would expand into 10^15 values). Counts each
    object once (memoised), so it takes time in the size of the pickle, not of the expansion."""
    counts = {}  # id -> values in the expansion of that container
    active = set()
    trail = []

    def count(v):
        if not isinstance(v, (dict, list, tuple, set, frozenset)):
            return 1
        if len(trail) > MAX_DEPTH:
            raise Refused(f"{where(trail)}: nested deeper than {MAX_DEPTH} levels")
        key = id(v)
        if key in active:
            raise Refused(f"{where(trail)}: the data contains itself (a cycle)")
        if key in counts:
            return counts[key]
        active.add(key)
        n = 1
        for k, item in (v.items() if isinstance(v, dict) else enumerate(v)):
            trail.append(k if isinstance(v, (list, tuple)) else str(k))
            n += count(item)
            trail.pop()
            if n > MAX_NODES:
                raise Refused(f"more than {MAX_NODES} values once written out (shared objects repeated over "
                              f"and over?)")
        active.discard(key)
        counts[key] = n
        return n

    count(data)


class Converter:
    """Copies unpickled data (checked by check_shape: no cycles, bounded) into JSON-ready values."""

    def __init__(self):
        self.non_finite = 0
        self.trail = []

    def convert(self, v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            if math.isfinite(v):
                return v
            self.non_finite += 1
            return None
        trail = self.trail
        if isinstance(v, dict):
            out = {}
            for k, item in v.items():
                if isinstance(k, bool) or k is None or isinstance(k, float):
                    key = json.dumps(k)
                elif isinstance(k, (str, int)):
                    key = str(k)
                else:
                    raise Refused(f"{where(trail)}: a dictionary key of type {type(k).__name__}")
                trail.append(key)
                out[key] = self.convert(item)
                trail.pop()
            return out
        if isinstance(v, (list, tuple, set, frozenset)):
            items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
            out = []
            for i, item in enumerate(items):
                trail.append(i)
                out.append(self.convert(item))
                trail.pop()
            return out
        raise Refused(f"{where(trail)}: a value of type {type(v).__name__}, which a snapshot does not hold")


def write_output(path, text):
    data = text.encode("utf-8") + b"\n"
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    if path.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main(argv):
    args = argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not 1 <= len(args) <= 2 or any(a.startswith("-") and a != "-" for a in args):
        print(f"usage: {PROG}.py IN.pickle [OUT.json]   (see --help)", file=sys.stderr)
        return 2
    src = args[0]
    dst = args[1] if len(args) == 2 else "-"
    name = "<stdin>" if src == "-" else src
    try:
        data = unpickle(read_input(src))
        if not isinstance(data, dict):
            raise Refused(f"not a memory snapshot: the pickle holds a {type(data).__name__}, not a dict")
        if "segments" not in data and "device_traces" not in data:
            raise Refused("not a memory snapshot: neither 'segments' nor 'device_traces' is present")
        check_shape(data)
        conv = Converter()
        out = conv.convert(data)
        text = json.dumps(out, allow_nan=False, separators=(",", ":"))
    except Refused as e:
        print(f"{PROG}: {name}: {e}", file=sys.stderr)
        return 1
    except RecursionError:
        print(f"{PROG}: {name}: nested too deeply", file=sys.stderr)
        return 1
    try:
        write_output(dst, text)
    except OSError as e:
        print(f"{PROG}: {dst}: cannot write: {e.strerror or e}", file=sys.stderr)
        return 1
    if conv.non_finite:
        print(f"{PROG}: {name}: {conv.non_finite} NaN or infinite number(s) written as null", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BrokenPipeError:
        sys.exit(1)
