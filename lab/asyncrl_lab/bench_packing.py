"""Attention memory of the two packed layouts, measured: a group's prompt shared in one row under a dense ``W x W``
mask, against the same samples one per row with no mask (``asyncrl.data.packing``).

One group of ``n`` responses behind a prompt of ``width / 8`` tokens, the responses filling the shared row to
``width`` tokens, on the ``tiny`` preset (fp32, SDPA). For each width and layout, a fresh process builds the inputs,
runs a warm-up pass at width 256, then one forward and backward of the responses' summed log-probs, and reports: the
mask's bytes, the peak resident memory above what the process held before the pass (``VmHWM``, reset just before
it; the mask is built inside the pass, as the trainer builds it) and the pass's seconds; and the same for one
layer's attention alone. The two layouts' losses and gradients are compared in this process at the smallest width.
``python -m asyncrl_lab.bench_packing [--widths 1024,4096,16384]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from asyncrl import losses
from asyncrl.data.packing import PackedInputs, pack, sharing_pays
from asyncrl.models.presets import build_model
from asyncrl.models.tokenizer import build_char_tokenizer

N = 8  # responses per group


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(key + ":"))
    return int(line.split()[1]) * 1024  # kB


def _reset_peak() -> int:
    """Resets the process's peak resident set (Linux: ``5`` into ``clear_refs``) and returns the resident bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def _inputs(width: int, layout: str) -> tuple[PackedInputs, list[list[int]], int]:
    P = width // 8
    R = (width - P) // N
    gen = torch.Generator().manual_seed(0)
    prompt = tuple(torch.randint(4, 14, (P,), generator=gen).tolist())
    responses = [torch.randint(4, 14, (R,), generator=gen).tolist() for _ in range(N)]
    segments = [list(range(N))] if layout == "shared" else [[i] for i in range(N)]
    return pack(segments, [prompt] * N, responses, pad_id=0), responses, P


def _loss_and_grads(model: torch.nn.Module, packed: PackedInputs, responses: list[list[int]]) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    out = model(
        input_ids=packed.input_ids_RW,
        attention_mask=packed.attention_mask(torch.float32),
        position_ids=packed.position_ids_RW,
    )
    logits = out.logits.reshape(-1, out.logits.shape[-1])[packed.src_BT]
    loss = -losses.logprobs_from_logits(logits, torch.tensor(responses)).sum()
    loss.backward()
    return loss.detach()


def _model(width: int) -> torch.nn.Module:
    tok = build_char_tokenizer(["0123456789"])
    model = build_model("tiny", tok, seed=0, max_position_embeddings=width)
    model.config._attn_implementation = "sdpa"
    return model


def _attention_alone(packed: PackedInputs, heads: int, head_dim: int) -> None:
    """One layer's attention as transformers' SDPA path calls it on these rows (keys repeated to every head): forward
    and backward, the mask built inside as the trainer builds it."""
    R, W = packed.input_ids_RW.shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(R, heads, W, head_dim, generator=gen).requires_grad_() for _ in range(3))
    mask = packed.attention_mask(torch.float32)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    out.sum().backward()


def one_case(width: int, layout: str, what: str) -> dict:
    """Runs in a fresh process: peak resident bytes are a process's high-water mark. ``what``: ``model`` (the tiny
    model's forward and backward) or ``attention`` (one of its layers' attention alone)."""
    torch.manual_seed(0)
    model = _model(width)
    packed, responses, P = _inputs(width, layout)
    mask = packed.attention_mask(torch.float32)
    mask_bytes = 0 if mask is None else mask.numel() * mask.element_size()
    del mask
    cfg = model.config

    def run(packed: PackedInputs, responses: list[list[int]]) -> None:
        if what == "model":
            _loss_and_grads(model, packed, responses)
        else:
            _attention_alone(packed, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads)

    run(*_inputs(256, layout)[:2])  # warm-up: the kernels' first-call costs stay out of the timing
    base = _reset_peak()
    t0 = time.perf_counter()
    run(packed, responses)
    seconds = time.perf_counter() - t0
    peak = _status_bytes("VmHWM")
    R, W = packed.input_ids_RW.shape
    return dict(
        what=what,
        width=width,
        layout=layout,
        rows=R,
        row_width=W,
        positions=R * W,
        mask_bytes=mask_bytes,
        peak_extra_bytes=peak - base,
        seconds=seconds,
        rule_shares=sharing_pays(P, [len(r) for r in responses]),
    )


def gradients_agree(width: int) -> dict:
    model = _model(width)
    got = {}
    for layout in ("shared", "per_row"):
        packed, responses, _ = _inputs(width, layout)
        loss = _loss_and_grads(model, packed, responses)
        got[layout] = (loss, [p.grad.clone() for p in model.parameters()])
    (a, ga), (b, gb) = got["shared"], got["per_row"]
    diff = max(float((x - y).abs().max()) for x, y in zip(ga, gb))
    scale = max(float(x.abs().max()) for x in ga)
    return dict(width=width, loss_shared=float(a), loss_per_row=float(b), max_grad_diff=diff, max_grad=scale)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="1024,4096,16384")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # width,layout: one measurement (child process)
    args = ap.parse_args()
    if args.case:
        width, layout, what = args.case.split(",")
        print(json.dumps(one_case(int(width), layout, what)))
        return
    print("loadavg before:", open("/proc/loadavg").read().strip(), "threads:", torch.get_num_threads())
    widths = [int(w) for w in args.widths.split(",")]
    print(json.dumps(gradients_agree(widths[0])))
    for what in ("attention", "model"):
        for width in widths:
            rows = {}
            for layout in ("shared", "per_row"):
                cmd = [sys.executable, "-m", "asyncrl_lab.bench_packing", "--case", f"{width},{layout},{what}"]
                res = subprocess.run(cmd, check=True, capture_output=True, text=True)
                rows[layout] = json.loads(res.stdout.strip().splitlines()[-1])
                print(json.dumps(rows[layout]))
            s, p = rows["shared"], rows["per_row"]
            print(
                f"{what} at width {width}: mask {s['mask_bytes'] / 2**20:.1f} MiB vs {p['mask_bytes']}; peak extra "
                f"{s['peak_extra_bytes'] / 2**20:.1f} MiB vs {p['peak_extra_bytes'] / 2**20:.1f} MiB; "
                f"seconds per_row/shared {p['seconds'] / s['seconds']:.2f}"
            )
    print("loadavg after:", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
