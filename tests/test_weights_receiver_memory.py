"""The weight-sync receiver holds at most two buckets beyond its model, whatever the model's size: measured.

A rollout worker (a subprocess, so its memory is its own) receives a ~95 MiB model in buckets of <= 6 MiB from the
trainer (this process) over a real gloo group and applies it to its RolloutEngine. Its peak resident memory during
the sync (Linux ``VmHWM``, reset just before the sync through ``/proc/self/clear_refs``) minus its resident memory
before the sync is the memory the receiver added: bytes held, measured, not an estimate. A receiver that gathers the
whole sync before applying it adds about one model size; one that applies each bucket as it arrives adds at most the
bucket being applied and the one being received.
"""

from __future__ import annotations

import json
import string
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from asyncrl.comm.groups import find_free_port
from asyncrl.models.lora import synced_tensors
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.weights.buckets import checksum
from asyncrl.weights.group import WeightSyncGroup

# ~25M parameters (~95 MiB in fp32): a second copy of it dwarfs two buckets and the allocator's noise
SHAPE = dict(hidden_size=768, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=2048)  # fmt: skip
BUCKET_MB = 4.0  # an MLP weight (6 MiB) is a bucket of its own: the largest bucket is 6 MiB
SLACK = 4 << 20  # bytes: headers, small Python objects, the allocator's rounding
TIMEOUT_S = 60.0

# The rollout worker: a RolloutEngine over its own (differently seeded) model of the same shape, receiving one sync.
RECEIVER = """
import json, string, sys, zlib
import torch
from asyncrl.models.lora import synced_tensors
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.weights.buckets import checksum
from asyncrl.weights.endpoints import SyncReceiverMixin

def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

class Worker(SyncReceiverMixin):
    def __init__(self):
        tok = build_char_tokenizer([string.printable[:95]])
        self.engine = RolloutEngine(build_model("tiny", tok, seed=1, **json.loads(sys.argv[2])), tok)

torch.set_num_threads(1)
worker = Worker()
worker.init_weight_sync(1, 2, "127.0.0.1", int(sys.argv[1]), 1.0, 60.0, "gloo")
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size: the peak below is this sync's
except OSError as e:
    reset = repr(e)
else:
    reset = None
before = kib("VmRSS")
stats = worker.receive_weights(verify=True, version=1)
peak = kib("VmHWM")
crcs = {name: checksum(t) for name, t in synced_tensors(worker.engine.model).items()}
print(json.dumps({"before": before, "peak": peak, "version": worker.engine.version, "crcs": crcs, "reset": reset}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_receiver_peak_memory_is_at_most_two_buckets_beyond_the_model():
    torch.manual_seed(0)
    tok = build_char_tokenizer([string.printable[:95]])
    params = synced_tensors(build_model("tiny", tok, seed=0, **SHAPE))
    model_bytes = sum(t.numel() * t.element_size() for t in params.values())
    port = find_free_port()
    child = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(port), json.dumps(SHAPE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        group = WeightSyncGroup.create(
            rank=0, world_size=2, port=port, params=params, bucket_mb=BUCKET_MB, timeout_s=TIMEOUT_S, backend="gloo"
        )
        try:
            sent = threading.Thread(target=group.send, args=(params, 1, True), daemon=True)
            sent.start()
            out, err = child.communicate(timeout=TIMEOUT_S * 2)
            sent.join(TIMEOUT_S)
        finally:
            group.close()
    finally:
        child.kill()
    assert child.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    if got["reset"] is not None:
        pytest.skip(f"cannot reset the peak resident size here (/proc/self/clear_refs: {got['reset']})")
    assert got["version"] == 1
    assert got["crcs"] == {name: checksum(t) for name, t in params.items()}  # every parameter arrived intact
    largest = max(b.nbytes for b in group.plan.buckets)
    extra = got["peak"] - got["before"]
    print(f"model {model_bytes / 2**20:.1f} MiB, {len(group.plan.buckets)} buckets of <= {largest / 2**20:.1f} MiB: "
          f"receiver peak extra {extra / 2**20:.1f} MiB")  # fmt: skip
    assert model_bytes > 4 * (2 * largest + SLACK)  # the bound below is far from one model copy
    assert extra <= 2 * largest + SLACK, f"receiver held {extra / 2**20:.1f} MiB beyond its model during the sync"
