"""Compile every kernel for the GPUs a Space may offer, without a GPU: python -m kernels.compile_check

Triton compiles to PTX and cubin on any machine (ptxas ships with it), so this catches a kernel that
does not build for an architecture, and reads the shared memory the compiled kernel really uses,
which must stay within that GPU's limit and within what kernels/config.py estimates (the estimate is
what refuses a config before launch). Run without TRITON_INTERPRET.
"""

import argparse
import os
import sys

# GPUs a Space may have: compute capability -> shared memory one block may use (bytes).
ARCHS = {75: ("T4", 65536), 80: ("A100", 166912), 86: ("A10G", 101376), 89: ("L4", 101376), 90: ("H100/H200", 232448)}
TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def _cases(dtype, arch):
    """(name, jit function, args: name -> type or constexpr value, num_warps, num_stages, estimate)."""
    from .attn import decode as AD
    from .attn import grouped as GQA
    from .attn import grouped_prefill as GQAP
    from .attn import kernel as A
    from .config import DeviceLimits, TileConfig
    from .elementwise import kernel as E
    from .kv_cache import kernel as KV
    from .layer import kernel as DL
    from .matmul import decode as FL
    from .matmul import kernel as L
    from .matmul import swiglu as SW
    from .norm import kernel as LN
    from .norm import rms as RMS
    from .rope import kernel as ROPE

    limits = DeviceLimits(ARCHS[arch][0], ARCHS[arch][1], 132, divmod(arch, 10), arch >= 80)
    t = "*" + TYPES[dtype]
    item = 2 if dtype != "float32" else 4
    prec = "ieee" if dtype == "float32" else "tf32"
    norm = dict(
        X=t,
        R=t,
        Y=t,
        S=t,
        W=t,
        B=t,
        stride_xm="i32",
        stride_rm="i32",
        stride_ym="i32",
        stride_sm="i32",
        M="i32",
        N="i32",
        eps="fp32",
        HAS_RESIDUAL=True,
        BLOCK_M=4,
        BLOCK_N=1024,
    )
    yield "layer_norm", LN._layer_norm_kernel, norm, 4, 1, 0
    yield "rms_norm", RMS._rms_norm_kernel, {k: v for k, v in norm.items() if k != "B"}, 4, 1, 0  # no bias
    import torch

    tdt = getattr(torch, dtype)
    glu = SW.resolve_config(None, 1024, 1536, 576, tdt, limits)
    blocks = dict(BLOCK_M=glu.block_m, BLOCK_N=glu.block_n, BLOCK_K=glu.block_k, GROUP_M=glu.group_m)
    matrices = dict(X=t, W=t, Y=t, M="i32", F="i32", K="i32", x_strides=["i32", 1], w_strides=["i32", 1])
    yield (
        "swiglu",
        SW._swiglu_kernel,
        dict(matrices, stride_ym="i32", PRECISION=prec, **blocks),
        glu.num_warps,
        glu.num_stages,
        SW.shared_memory(glu, item, limits),
    )
    cache = [t, "i32", "i32", "i32", 1]  # a tensor with its strides, as the kernel takes it
    gqa = dict(query=[t, "i32", "i32", 1], keys=cache, values=cache, out=[t, "i32", "i32", 1], Lengths="*i32")
    gqa |= dict(partial=["*fp32", "*i32", "i32"], kv_heads="i32", group="i32", CHUNK="i32", positions="i32")
    blocks = dict(HEAD_DIM=64, PRECISION=prec, BLOCK_G=16, BLOCK_N=64, BLOCK_D=64, BLOCK_S=32, BLOCK_GM=4)
    blocks |= dict(scale_log2="fp32", ONE_TILE=True)
    yield "grouped_decode_attention", GQA._grouped_decode_kernel, dict(gqa, **blocks), 4, 3 if arch >= 80 else 2, 0
    gqa_prefill = dict(Q=t, K=t, V=t, Out=t, q_strides=["i32", "i32", "i32", 1], k_strides=["i32", "i32", "i32", 1])
    gqa_prefill |= dict(v_strides=["i32", "i32", "i32", 1], kv_heads="i32", group="i32", tq="i32", tk="i32")
    blocks = dict(HEAD_DIM=64, CAUSAL=True, PRECISION=prec, BLOCK_R=64, BLOCK_N=64, BLOCK_D=64)
    yield (
        "grouped_attention",
        GQAP._grouped_attention_kernel,
        dict(gqa_prefill, scale_log2="fp32", **blocks),
        4,
        3 if arch >= 80 else 2,
        0,
    )
    rope = dict(X=t, Y=t, Positions="*i64", x_strides=["i32", "i32", "i32"], heads="i32", tokens="i32")
    yield "rotary", ROPE._rotary_kernel, dict(rope, log2_theta="fp32", HEAD_DIM=64, BLOCK_M=64, HALF=32), 4, 1, 0
    ints = dict(M="i32", N="i32", K="i32", stride_xm="i32", stride_xk=1, stride_wn="i32", stride_wk=1)
    for rows, split in ((4096, None), (1, TileConfig(split_k=4))):
        cfg = L.resolve_config(split, rows, 3072, 768, tdt, limits)
        est = L.shared_memory(cfg, item, limits)
        blocks = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k)
        if cfg.split_k == 1:
            args = dict(
                X=t,
                W=t,
                Bias=t,
                R=t,
                Y=t,
                **ints,
                stride_rm="i32",
                stride_ym="i32",
                HAS_BIAS=True,
                APPLY_GELU=True,
                HAS_RESIDUAL=True,
                PRECISION=prec,
                **blocks,
                GROUP_M=cfg.group_m,
            )
            yield ("linear", L._linear_kernel, args, cfg.num_warps, cfg.num_stages, est)
        else:
            yield (
                "linear split-k",
                L._linear_split_k_kernel,
                dict(X=t, W=t, P="*fp32", **ints, K_PER_SPLIT="i32", PRECISION=prec, **blocks),
                cfg.num_warps,
                cfg.num_stages,
                est,
            )
            yield (
                "linear split-k reduce",
                L._split_k_reduce_kernel,
                dict(
                    P="*fp32",
                    Bias=t,
                    R=t,
                    Y=t,
                    M="i32",
                    N="i32",
                    SPLIT_K="i32",
                    stride_rm="i32",
                    stride_ym="i32",
                    HAS_BIAS=True,
                    APPLY_GELU=True,
                    HAS_RESIDUAL=False,
                    BLOCK_M=16,
                    BLOCK_N=128,
                ),
                4,
                1,
                0,
            )
    for residual in (False, True) if arch >= 90 and dtype != "float32" else ():  # the persistent form: Hopper on
        cfg = L.resolve_config(None, 4096, 3072, 768, tdt, limits, True, residual)
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        desc = lambda rows, cols: f"tensordesc<{TYPES[dtype]}[{rows},{cols}]>"
        args = dict(
            XDesc=desc(bm, bk),
            WDesc=desc(bn, bk),
            YDesc=desc(bm, bn),
            Bias=t,
            R=t,
            M="i32",
            N="i32",
            K="i32",
            stride_rm="i32",
            HAS_BIAS=True,
            APPLY_GELU=not residual,
            HAS_RESIDUAL=residual,
            PRECISION=prec,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=cfg.group_m,
            PROGRAMS=132,
        )
        yield (
            f"linear persistent{' + res' if residual else ''}",
            L._linear_persistent_kernel,
            args,
            cfg.num_warps,
            cfg.num_stages,
            L.shared_memory(cfg, item, limits, True, residual),
        )
    pdl = arch >= 90  # programmatic dependent launch from Hopper on (kernels.pdl)
    # A list is a tuple argument, element by element: a tensor with its strides (unit strides are constants).
    cache = [t, "i32", "i32", "i32", 1]
    groups = dict(
        x=[t, "i32", 1],
        w=[t, "i32", 1],
        norm=[t, t, "fp32"],
        Bias=t,
        res=[t, "i32"],
        y=[t, "i32"],
        partial=["*fp32", "*i32", "i32"],
        kv=[t, t, "*i32", "i32", cache[1:], cache[1:]],
    )
    sizes = dict.fromkeys(("M", "N", "K", "K_PER_SPLIT"), "i32")
    # ln_1 -> c_attn -> KV cache in the K loop, split over K
    cfg = FL.resolve_config(TileConfig(block_n=32, block_k=128, split_k=4), 1, 2304, 768, tdt, limits)
    args = groups | sizes | dict(APPLY_GELU=True, PRECISION=prec, BLOCK_M=16, BLOCK_N=cfg.block_n)
    args |= dict(BLOCK_K=cfg.block_k, PDL=pdl) | FL.stats_tile(1, 768)
    yield (
        "decode linear",
        FL._decode_linear_kernel,
        args,
        cfg.num_warps,
        cfg.num_stages,
        L.shared_memory(cfg, item, limits),
    )
    # The prefetch form at its defaults: c_attn's (one split) and mlp.c_proj's (split over K, arrival)
    for n, k in ((2304, 768), (768, 3072)):
        cfg = FL.resolve_config(None, 1, n, k, tdt, limits)
        k_per_split, splits = FL.splits_of(cfg, k)
        head_k, tail_k = FL.slice_tiles(k_per_split)
        args = groups | sizes | dict(partial=groups["partial"] if splits > 1 else None, APPLY_GELU=True, PDL=pdl)
        args |= dict(ROWS=1, BLOCK_N=cfg.block_n, HEAD_K=head_k, TAIL_K=tail_k, STATS_COLS=FL.next_pow2(k))
        yield (f"decode prefetch {n}x{k}", FL._decode_prefetch_kernel, args, cfg.num_warps, cfg.num_stages, 0)
    strides = {f"stride_{x}{d}": "i32" for x in "qkvo" for d in ("b", "h", "m" if x in "qo" else "n")}
    strides |= {f"stride_{x}d": 1 for x in "qkvo"}
    cfg = A.resolve_config(None, 1024, 64, tdt, limits)
    est = A.shared_memory(cfg, 64, item, limits)
    yield (
        "attention",
        A._attention_kernel,
        dict(
            Q=t,
            K=t,
            V=t,
            Out=t,
            **strides,
            H="i32",
            TQ="i32",
            TK="i32",
            qk_scale="fp32",
            CAUSAL=True,
            HEAD_DIM=64,
            PRECISION=prec,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_D=64,
        ),
        cfg.num_warps,
        cfg.num_stages,
        est,
    )
    rows = [t, "i32", "i32", 1]  # q and o: (B, H, 1, D) by sequence, head and dim
    qkv = dict(query=rows, keys=cache, values=cache, Lengths="*i32")
    sizes = dict(H="i32", CHUNK="i32", qk_scale="fp32")
    # A chunk of one key tile in the vector loop (B=1, 8192 keys: 64 splits) or loaded around the PDL wait, and
    # chunks of several tiles in the dot form (8 splits of 8192 keys, and the default at B=8).
    for form, split_k, batch_heads in (("1 tile", None, 12), ("dot", 8, 12), ("dot default", None, 96)):
        cfg, *_, dot, _, _ = AD.launch_plan(TileConfig(split_k=split_k), batch_heads, 8192, 64, tdt, limits)
        est = AD.decode_shared_memory(cfg, 64, item)
        assert dot == form.startswith("dot"), (form, cfg)
        tiles = dict(HEAD_DIM=64, BLOCK_N=cfg.block_n, BLOCK_D=64)
        yield (
            f"decode attention {form}",
            AD._decode_partial_kernel,
            qkv | sizes | tiles | dict(Part="*fp32", SPLITS="i32", PREFETCH=False, DOT=dot),
            cfg.num_warps,
            cfg.num_stages,
            est,
        )
        for prefetch in (False, True) if not dot else (False,):
            args = qkv | sizes | tiles | dict(out=rows, partial=["*fp32", "*i32", "i32"], BLOCK_S=8, PDL=pdl)
            yield (
                f"decode one launch {form}{' held' if prefetch else ''}",
                AD._decode_one_launch_kernel,
                args | dict(PREFETCH=prefetch, DOT=dot),
                cfg.num_warps,
                cfg.num_stages,
                est,
            )
    plan = DL.plan(1, 768, 12, 1024, tdt, limits)
    layer = dict(X=t, Out=t, Times=None, Sync="*i32", M="i32", C="i32", H="i32")
    layer |= dict(ln_1=[t, t, "fp32"], ln_2=[t, t, "fp32"], scratch=[t, t, t, t])
    layer |= dict.fromkeys(("c_attn", "c_proj", "c_fc", "mlp_proj"), [t, t])
    layer |= dict(cache=[t, t, "*i32", "*i32", "i32", cache[1:], cache[1:]])
    layer |= dict(attention=["*fp32", "*i32", "i32", "i32", "fp32"])
    layer |= plan["constexprs"]  # as launched for one sequence of GPT-2 small
    yield ("decode layer", DL._decode_layer_kernel, layer, DL.WARPS, 1, 0)
    yield (
        "decode merge",
        AD._decode_merge_kernel,
        dict(Part="*fp32", out=rows, H="i32", SPLITS="i32", HEAD_DIM=64, BLOCK_S=8, BLOCK_D=64),
        4,
        1,
        0,
    )
    kv_strides = {f"stride_{x}{d}": "i32" for x in ("k", "v") for d in "bh"} | {"stride_kd": 1, "stride_vd": 1}
    kv_strides |= {f"stride_{x}c{d}": "i32" for x in "kv" for d in "bht"} | {"stride_kcd": 1, "stride_vcd": 1}
    yield (
        "kv write",
        KV._kv_write_kernel,
        dict(K=t, V=t, KC=t, VC=t, Lengths="*i32", **kv_strides, heads="i32", HEAD_DIM=64, BLOCK_D=64),
        1,
        1,
        0,
    )
    block = E.default_config(1 << 20, limits).block_n
    yield ("add", E._add_kernel, dict(X=t, Y=t, Out=t, N="i32", BLOCK_N=block), 4, 1, 0)
    yield ("bias add", E._bias_add_kernel, dict(X=t, Bias=t, Out=t, N="i32", WIDTH="i32", BLOCK_N=block), 4, 1, 0)
    yield ("gelu", E._gelu_kernel, dict(X=t, Out=t, N="i32", BLOCK_N=block), 4, 1, 0)


def _signature(arg, path: tuple, consts: dict, attrs: dict, constant: bool = False):
    """One argument's type for ASTSource: a type string, a constant (recorded in consts at its path), or for a
    list (a tuple argument) a tuple of its elements' types. As the JIT specialises a launch, pointers and
    integers are taken as multiples of 16, which GPT-2's widths are: without that, masks along a contiguous
    dimension forbid vector loads and the loop is not pipelined."""
    if isinstance(arg, list):
        return tuple(_signature(a, (*path, j), consts, attrs) for j, a in enumerate(arg))
    if not isinstance(arg, str) or constant:
        consts[path] = arg
        return "constexpr"
    if arg.startswith("*") or arg == "i32":
        attrs[path] = [["tt.divisibility", 16]]
    return arg


def compile_all(archs, dtypes):
    """Yield (arch, dtype, name, shared bytes used, estimate, limit); raises if a kernel fails to build."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for arch in archs:
        for dtype in dtypes:
            if dtype == "bfloat16" and arch < 80:
                continue  # no bf16 before Ampere; config.supported_dtypes does not offer it there
            for name, fn, args, warps, stages, estimate in _cases(dtype, arch):
                names = fn.arg_names
                missing = set(names) - set(args)
                assert not missing, f"{name}: no type for {missing}"
                sig, consts, attrs = {}, {}, {}
                for i, n in enumerate(names):
                    sig[n] = _signature(args[n], (i,), consts, attrs, constant=n == "PRECISION")
                src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
                k = triton.compile(
                    src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages)
                )
                yield arch, dtype, name, k.metadata.shared, estimate, ARCHS[arch][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, nargs="*", default=sorted(ARCHS))
    parser.add_argument("--dtype", nargs="*", default=["float16", "bfloat16"])
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: this compiles the kernels for real GPUs")
    failures = 0
    for arch, dtype, name, shared, estimate, limit in compile_all(args.arch, args.dtype):
        ok = shared <= limit and (estimate == 0 or shared <= estimate)
        failures += not ok
        head = f"sm_{arch} {ARCHS[arch][0]:10} {dtype:9} {name:26}"
        print(f"{head} shared {shared:7} estimate {estimate:7} limit {limit:7} {'ok' if ok else 'OVER'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
