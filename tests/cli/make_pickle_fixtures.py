#!/usr/bin/env python3
"""Writes the pickle fixtures of tests/cli/fixtures/ (committed; run again only to change them):
snapshots as Python's pickle module writes them at protocols 2, 4 and 5, plain and gzip'ed, one of
PyTorch's fixture, one whose blocks share frame dicts through the memo, and hostile or damaged pickles
that alloc_snapshot must refuse with a message.   usage: make_pickle_fixtures.py FIXTURES_DIR"""
import gzip
import json
import os
import pickle
import struct
import sys

os.chdir(sys.argv[1])


def write(name, data):
    with open(name, "wb") as f:
        f.write(data)


d = json.load(open("cachalot_small.json"))
# As PyTorch pickles a snapshot: pool ids as tuples, frames as dicts, integer keys.
for s in d["segments"]:
    s["segment_pool_id"] = tuple(s["segment_pool_id"])
rp2 = d["allocator_settings"]["roundup_power2_divisions"]
d["allocator_settings"]["roundup_power2_divisions"] = {int(k): v for k, v in rp2.items()}
write("pk_p2.pickle", pickle.dumps(d, protocol=2))
write("pk_p4.pickle", pickle.dumps(d, protocol=4))
write("pk_p5.pickle", pickle.dumps(d, protocol=5))
write("pk_p4.pickle.gz", gzip.compress(pickle.dumps(d, protocol=4), mtime=0))
write("pk_p2.pickle.gz", gzip.compress(pickle.dumps(d, protocol=2), mtime=0))
write("pk_torch.pickle", pickle.dumps(json.load(gzip.open("torch_small.json.gz")), protocol=4))
# One frame list shared by every segment and block: the memo holds it once, the reader copies it.
frames = [{"name": "forward", "filename": "model.py", "line": 12}, {"name": "step", "filename": "train.py", "line": 3}]
shared = json.loads(json.dumps(d))
for s in shared["segments"]:
    s["frames"] = frames
    for b in s["blocks"]:
        b["frames"] = frames
write("pk_shared.pickle", pickle.dumps(shared, protocol=4))

P4 = b"\x80\x04"
# GLOBAL os system, then REDUCE: os.system('touch pwned') when unpickled by Python.
write("pk_evil_global.pickle", b"\x80\x02cos\nsystem\nX\x0b\x00\x00\x00touch pwnedq\x00\x85R.")
write("pk_stack_global.pickle", P4 + b"\x8c\x02os\x8c\x06system\x93\x8c\x0btouch pwned\x85R.")
write("pk_build.pickle", P4 + b"}\x8c\x01a}b.")
write("pk_persid.pickle", P4 + b"\x8c\x01xQ.")
write("pk_bytes.pickle", P4 + b"}\x8c\x08segmentsC\x03abcs.")
bomb = []
for _ in range(64):
    bomb = [bomb, bomb]
write("pk_memo_bomb.pickle", pickle.dumps({"segments": bomb}, protocol=4))
write("pk_deep.pickle", P4 + b"]" * 100000 + b"a" * 99999 + b".")
write("pk_lying.pickle", P4 + b"}X\xe8\x03\x00\x00segments].")
write("pk_proto6.pickle", b"\x80\x06}.")
write("pk_bad_utf8.pickle", P4 + b"}\x8c\x08segm\xffnts]s.")
write("pk_huge_long.pickle", P4 + b"}\x8c\x08segments\x8b\x00\x10\x00\x00" + b"\x01" * 4096 + b"s.")
write("pk_inexact.pickle", P4 + b"}\x8c\x08segments\x8a\x08" + struct.pack("<q", 2**53 + 1) + b"s.")
write("pk_nan.pickle", P4 + b"}\x8c\x08segmentsG" + struct.pack(">d", float("nan")) + b"s.")
write("pk_list.pickle", pickle.dumps([1, 2, 3], protocol=4))
write("pk_cycle.pickle", P4 + b"}\x94\x8c\x08segments\x94h\x00s.")
write("pk_trailing.pickle", pickle.dumps(d, protocol=4) + b"\n")
write("pk_truncated.pickle", pickle.dumps(d, protocol=4)[:300])
