"""The compute side of the cost model: FLOPs of each GEMM of a transformer layer and of the head,
their time on a GPU (roofline with a size-dependent efficiency), and the bytes of the memory-bound
ops (LayerNorm, softmax, dropout, GELU, residual) derived from the activation accounting of
Korthikanti et al. 2022. docs/whatif.md, "Compute".

Plain floats only: `ptprof plan` calls this for every distinct (microbatch, tp, cp, sp) of ~10^5
layouts, so per-layer costs are cached by profiler.costmodel.
"""

from __future__ import annotations

import math

from profiler.cluster import Cluster

# Streaming multiprocessors (compute units) per GPU, vendor datasheets: A100 108 SMs (NVIDIA A100
# Tensor Core GPU Architecture whitepaper), H100/H200 SXM 132 SMs (NVIDIA H100 whitepaper; the H200
# is the same GH100 die), B200 148 SMs (NVIDIA Blackwell datasheet, 2 dies x 74), MI300X 304 CUs
# (AMD CDNA 3 whitepaper). A cluster may carry `sms` itself; unknown GPUs get no wave quantization.
SMS_BY_NAME = {"a100": 108, "h100": 132, "h200": 132, "b200": 148, "mi300x": 304}
# Output tile of one thread block of a large cuBLAS/CUTLASS half-precision GEMM: 256x128 (NVIDIA
# "Matrix Multiplication Background User's Guide", the tile of its wave-quantization example).
TILE_M, TILE_N = 256, 128


def sm_count(cluster: Cluster) -> int | None:
    """SMs of the cluster's GPU: its own `sms` field if it has one, else by preset name, else None."""
    n = getattr(cluster, "sms", None)
    if isinstance(n, int) and n > 0:
        return n
    name = (cluster.name or "").lower()
    if "h100" in name and "pcie" in name:
        return 114  # H100 PCIe: 114 SMs (NVIDIA H100 whitepaper), not the SXM5's 132
    for key, sms in SMS_BY_NAME.items():
        if key in name:
            return sms
    return None


def wave_efficiency(m: int, n: int, sms: int | None, batch: int = 1) -> float:
    """Share of the SMs' tile-time that does useful work: m·n / (waves · SMs · 256·128), over
    256x128 output tiles (either orientation, the better one: cuBLAS picks its kernel per shape).
    It holds both of NVIDIA's losses ("Matrix Multiplication Background User's Guide"): tile
    quantization (a partial tile costs a whole one) and wave quantization (1.1 waves of tiles take
    as long as 2). 1 without an SM count."""
    if not sms:
        return 1.0
    best = 0.0
    for tm, tn in ((TILE_M, TILE_N), (TILE_N, TILE_M)):
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        best = max(best, batch * m * n / (math.ceil(tiles / sms) * sms * tm * tn))
    return best


def gemm_time_s(m: int, n: int, k: int, cluster: Cluster, dtype_bytes: int = 2, *, batch: int = 1,
                sms: int | None = -1) -> float:
    """Seconds of `batch` GEMMs (m x k) @ (k x n) on one GPU of `cluster`, roofline-style:
    max(2mnk / (peak · gemm_efficiency · wave_efficiency), bytes / (HBM · hbm_efficiency)), bytes =
    dtype_bytes · (mk + kn + mn) read and written once. gemm_efficiency is the large-GEMM share of
    peak (the preset's, e.g. a maximum-achievable-matmul benchmark); wave_efficiency the SM
    occupancy of its last wave (sms=-1: from the cluster; None: not modelled)."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    if sms == -1:
        sms = sm_count(cluster)
    flops = 2.0 * m * n * k * batch
    rate = cluster.peak_tflops * 1e12 * cluster.gemm_efficiency * wave_efficiency(m, n, sms, batch)
    nbytes = dtype_bytes * batch * (m * k + k * n + m * n)
    return max(flops / rate, nbytes / (cluster.hbm_gbps * 1e9 * cluster.hbm_efficiency))


def memory_bound_time_s(nbytes: float, cluster: Cluster) -> float:
    """Seconds to stream `nbytes` through HBM (read + written, counted once each) at
    hbm_efficiency of the bandwidth: the time of an elementwise / normalization / optimizer kernel."""
    return max(0.0, nbytes) / (cluster.hbm_gbps * 1e9 * cluster.hbm_efficiency)


def layer_gemms(b: int, s: int, h: int, heads: int, ffn: int, t: int = 1, cp: int = 1,
                top_k: int = 0) -> dict[str, tuple[int, int, int, int]]:
    """The forward GEMMs of one transformer layer for a microbatch of b sequences on one GPU, as
    {name: (m, n, k, batch)} (Megatron tensor parallelism over t: column-parallel QKV and MLP-up,
    row-parallel output and MLP-down; context parallelism cp: s/cp local queries against all s
    keys; top_k > 0: a MoE MLP, each token through k experts). Tokens T = b·s/cp.
    FLOPs 2mnk·batch each; per token: 6h² (QKV) + 2h² (out) + 4h·ffn (MLP) + 4·s·h (scores and
    weighted sum), over t: with ffn = 4h, 24h²(1 + s/6h) -- Narayanan et al. 2021, eq. (3)'s 24."""
    sl = s // cp
    tok = b * sl
    d = h // heads
    mlp_tok = tok * max(top_k, 1)
    return {
        "qkv": (tok, 3 * h // t, h, 1),
        "scores": (sl, s, d, b * heads // t),  # QK^T per head: (s/cp x d) @ (d x s)
        "context": (sl, d, s, b * heads // t),  # softmax(QK^T) @ V per head
        "out": (tok, h, h // t, 1),
        "mlp_up": (mlp_tok, ffn // t, h, 1),
        "mlp_down": (mlp_tok, h, ffn // t, 1),
    }


def gemm_flops(shapes: dict[str, tuple[int, int, int, int]]) -> float:
    """Sum of 2mnk·batch over {name: (m, n, k, batch)}."""
    return float(sum(2.0 * m * n * k * bt for m, n, k, bt in shapes.values()))


def gemm_pass_times(shapes: dict[str, tuple[int, int, int, int]], cluster: Cluster,
                    dtype_bytes: float = 2) -> tuple[float, float]:
    """(forward, backward) seconds of these GEMMs: backward = the data gradient (m x n)@(n x k) and
    the weight gradient (k x m)@(m x n) of each, the same FLOPs as its forward each (so 2x)."""
    fwd, dgrad, wgrad = gemm_pass_parts(shapes, cluster, dtype_bytes)
    return fwd, dgrad + wgrad


def gemm_pass_parts(shapes: dict[str, tuple[int, int, int, int]], cluster: Cluster,
                    dtype_bytes: float = 2) -> tuple[float, float, float]:
    """(forward, data-gradient, weight-gradient) seconds of these GEMMs (gemm_pass_times split:
    zero-bubble schedules move the weight gradients into the pipeline's bubble)."""
    sms = sm_count(cluster)
    fwd = dgrad = wgrad = 0.0
    for m, n, k, bt in shapes.values():
        fwd += gemm_time_s(m, n, k, cluster, dtype_bytes, batch=bt, sms=sms)
        dgrad += gemm_time_s(m, k, n, cluster, dtype_bytes, batch=bt, sms=sms)
        wgrad += gemm_time_s(k, n, m, cluster, dtype_bytes, batch=bt, sms=sms)
    return fwd, dgrad, wgrad


ATTN_CORE = ("scores", "context")  # what selective recomputation runs again


def layer_memory_bound_bytes(b: int, s: int, h: int, heads: int, ffn: int, t: int = 1, cp: int = 1,
                             sp: bool = False, top_k: int = 0, act_bytes: int = 2,
                             flash: bool = False) -> dict[str, float]:
    """HBM bytes of one layer's forward memory-bound ops for a microbatch on one GPU, each op read
    once and written once, the tensors being those of Korthikanti et al. 2022's accounting:
    - layernorm x2: read x (2sbh), write y (2sbh): 8sbh;
    - bias-dropout-add x2 (Megatron's fused kernel): read x and residual, write y (2sbh each) and
      the 1-byte mask (sbh): 14sbh;
    - bias-GELU (fused): read and write sb·ffn at 2 bytes: 4sb·ffn/t (k·… for a MoE MLP);
    - scale-mask-softmax and attention dropout (Megatron's fused softmax, no flash attention, as
      the paper): softmax read + write 2as²b each, dropout read + write + mask: 9as²b/t.
    With sp the layernorm and dropout-add parts split over t too (each rank holds s/t tokens).
    flash: the fused kernel keeps scores on chip; its HBM traffic is Q, K, V in and O out: 8sbh/t.
    Bytes scale with act_bytes/2. Returns {"attn_core": softmax+dropout, "other": the rest}."""
    sl = s // cp
    sbh = sl * b * h * act_bytes / 2
    rep = t if sp else 1
    other = (8 + 14) * sbh / rep + 4 * sl * b * ffn * max(top_k, 1) * act_bytes / 2 / t
    attn = (8 * sl * b * h if flash else 9 * heads * sl * s * b) * act_bytes / 2 / t
    return {"attn_core": attn, "other": other}


def head_gemms(b: int, s: int, h: int, vocab: int, t: int = 1, cp: int = 1) -> dict[str, tuple[int, int, int, int]]:
    """The output projection (vocabulary-parallel over t): (T x h) @ (h x ⌈V/t⌉), T = b·s/cp (the
    vocabulary padded to a multiple of t, as ModelSpec.vocab_per_rank)."""
    return {"logits": (b * (s // cp), -(-vocab // t), h, 1)}


def head_memory_bound_bytes(b: int, s: int, h: int, vocab: int, t: int = 1, cp: int = 1, sp: bool = False,
                            act_bytes: int = 2) -> float:
    """Final layernorm (8sbh, /t with sp) and the vocabulary-parallel cross entropy over fp32
    logits: read 2-byte logits, write and read fp32 softmax (2 + 4 + 4 bytes per logit): 10sbV/t."""
    sl = s // cp
    return 8 * sl * b * h * act_bytes / 2 / (t if sp else 1) + 10.0 * sl * b * -(-vocab // t)


def model_flops_per_sequence(layers: int, s: int, h: int, heads: int, ffn: int, vocab: int, top_k: int = 0,
                             moe_layers: int = 0) -> float:
    """Model FLOPs of one sequence's forward + backward (3 passes, no recomputation), the MFU
    numerator: 3 · (Σ layers' forward GEMMs + the head's 2shV). With ffn = 4h and no MoE this is
    72·s·l·h²(1 + s/6h) + 6shV (Narayanan et al. 2021 eq. (3) without its recomputation)."""
    dense = gemm_flops(layer_gemms(1, s, h, heads, ffn))
    moe = gemm_flops(layer_gemms(1, s, h, heads, ffn, top_k=top_k)) if moe_layers else 0.0
    fwd = (layers - moe_layers) * dense + moe_layers * moe + 2.0 * s * h * vocab
    return 3.0 * fwd
