"""The compile stage of `mlactl tune`: build each kernel config for a GPU architecture, no GPU needed.

For every (kernel, shape, config) it runs Triton's own compiler for the target (sm_80, sm_90 or
sm_100) and then the ptxas that Triton selects for that target (``get_ptxas`` in
triton/backends/nvidia/compiler.py: Triton 3.9 takes ``ptxas-blackwell``, CUDA 13.4, from sm_90
on; Triton 3.6 takes its ``ptxas``, CUDA 12.8, below sm_100), and reports:

* ``smem_bytes``: the shared memory Triton allocates (``metadata.shared``);
* ``registers``, ``stack_bytes``, ``spill_bytes`` (spill stores + spill loads), from ``ptxas -v``;
* ``warnings``: ptxas warnings, e.g. C7515 (wgmma serialised) or C7508 (setmaxnreg ignored);
* ``wgmma_per_loop`` / ``mma_per_loop``: tensor-core instructions in the PTX of the busiest loop
  (the tile loop), and ``sass``: HGMMA / QGMMA / HMMA counts in the whole SASS.

A config *fails* the stage when it spills, when its shared memory is over the target's opt-in
limit, or when it does not compile; `mlactl tune` drops such configs before timing them and
records why. Compiling needs Triton's JIT, not its interpreter, so `compile_cases` runs the
work in a child process with TRITON_INTERPRET unset (``python -m mlactl.tune.compile``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field

from mlactl.model.config import MLAConfig
from mlactl.model.cost import CostModel
from mlactl.tune import space
from mlactl.util.defaults import KV_PAGE

ARCHS = {"sm_80": 80, "sm_90": 90, "sm_100": 100}
# opt-in shared memory per block: A100 163 KiB; H100/H200 and B200 227 KiB (CUDA guide, table 21)
SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024}
KERNELS = ("mla_decode", "mla_prefill", "merge_attn_states", "mla_sparse_decode")
SPARSE_TOPK = 2048  # DeepSeek-V3.2's index_topk: the sparse decode's bucket for a model without one


@dataclass
class Case:
    """One compile: a kernel, its shape bucket, a launch config and the dtypes."""

    kernel: str
    shape: dict
    config: dict
    arch: str = "sm_90"
    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    r: int = 512
    dR: int = 64
    dC: int = 128
    dV: int = 128
    page: int = KV_PAGE
    label: str = ""  # "default" or "candidate"
    extra: dict = field(default_factory=dict)


# ---- parsing (pure; unit-tested on captured text) ------------------------------------------------

_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_WARN = re.compile(r"warning\s*:\s*(.*)", re.I)


def parse_ptxas_log(log: str) -> dict:
    """Registers, stack frame, spill bytes and warnings from a ``ptxas -v`` log of one kernel."""
    regs = _REGS.search(log)
    stack = _STACK.search(log)
    stack_b, stores, loads = (int(g) for g in stack.groups()) if stack else (0, 0, 0)
    warnings = []
    for line in log.splitlines():
        m = _WARN.search(line)
        if m:
            warnings.append(m.group(1).strip())
    return {
        "registers": int(regs.group(1)) if regs else None,
        "stack_bytes": stack_b,
        "spill_stores": stores,
        "spill_loads": loads,
        "spill_bytes": stores + loads,
        "warnings": warnings,
    }


# what one trip of the busiest PTX loop (the key loop) issues besides its tensor-core work, for the
# cycle estimates in docs/kernels.md: CTA barriers, wgmma drains (wait_group), KV copies (TMA
# tensor copies or 16-byte cp.async), and the global loads/stores and shared-memory accesses of
# the loop body (p and alpha's scratch round trip under the split score, the block table)
LOOP_OPS = {
    "bar_sync": "bar.sync",
    "wgmma_wait": "wgmma.wait_group",
    "tma_copy": "cp.async.bulk.tensor",
    "cp_async": "cp.async.cg.shared",
    "ld_global": "ld.global",
    "st_global": "st.global",
    "ld_shared": "ld.shared",
    "st_shared": "st.shared",
    "ldmatrix": "ldmatrix",
}
_LABEL = re.compile(r"^\s*(\$L__\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")


def _loops(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of every PTX loop: a label and a later branch back to it."""
    where = {}
    loops = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            where[m.group(1)] = i
        b = _BRANCH.search(line)
        if b and b.group(1) in where:
            loops.append((where[b.group(1)], i))
    return loops


def loop_counts(ptx: str, patterns: dict[str, str]) -> dict[str, int]:
    """Per pattern, its count in the busiest PTX loop (a label and the last branch back to it).

    A loop is the text between a label and a later branch to it; for nested loops the outer one
    holds the inner, so the count is the most found in any one loop: the tile loop's body.
    """
    lines = ptx.splitlines()
    loops = _loops(lines)
    out = {}
    for name, pat in patterns.items():
        best = 0
        for lo, hi in loops:
            best = max(best, sum(1 for line in lines[lo : hi + 1] if pat in line))
        out[name] = best
    return out


_MMA_SHAPE = re.compile(r"\b(wgmma\.mma_async|mma\.sync)\.[\w.]*?\.m(\d+)n(\d+)k(\d+)\b")


def loop_mma_macs(ptx: str) -> dict[str, int]:
    """Multiply-adds of the tensor-core instructions in the busiest PTX loop, by kind, as written
    in the PTX (one warpgroup's wgmma, one warp's mma.sync): m * n * k summed over instructions."""
    lines = ptx.splitlines()
    best = {"wgmma": 0, "mma": 0}
    for lo, hi in _loops(lines):
        got = {"wgmma": 0, "mma": 0}
        for line in lines[lo : hi + 1]:
            m = _MMA_SHAPE.search(line)
            if m:
                kind = "wgmma" if m.group(1).startswith("wgmma") else "mma"
                got[kind] += int(m.group(2)) * int(m.group(3)) * int(m.group(4))
        if sum(got.values()) > sum(best.values()):
            best = got
    return best


def loop_mma_shapes(ptx: str) -> dict[str, int]:
    """Tensor-core instructions of the busiest PTX loop (the one loop_mma_macs picks) by kind and
    shape, as one warpgroup (wgmma) or one warp (mma.sync) issues them: {"wgmma m64n16k16": 36}."""
    lines = ptx.splitlines()
    best: dict[str, int] = {}
    most = 0
    for lo, hi in _loops(lines):
        got: dict[str, int] = {}
        macs = 0
        for line in lines[lo : hi + 1]:
            m = _MMA_SHAPE.search(line)
            if m:
                kind = "wgmma" if m.group(1).startswith("wgmma") else "mma"
                key = f"{kind} m{m.group(2)}n{m.group(3)}k{m.group(4)}"
                got[key] = got.get(key, 0) + 1
                macs += int(m.group(2)) * int(m.group(3)) * int(m.group(4))
        if macs > most:
            best, most = got, macs
    return best


_SHARED_ACCESS = re.compile(r"\b(ld|st)\.shared(?:::cta)?(?:\.v([248]))?\.[busf](8|16|32|64|128)\b")
_LDMATRIX = re.compile(r"\bldmatrix\.sync\.aligned\.m8n8\.x([124])\b")
_CP_ASYNC = re.compile(r"\bcp\.async\.c[ag]\.shared\.global\s*\[[^]]*\],\s*\[[^]]*\],\s*(0x[0-9a-fA-F]+|\d+)")


def loop_shared_bytes(ptx: str) -> dict[str, int]:
    """Shared-memory bytes one thread moves per trip of the busiest PTX loop (the one
    loop_mma_macs picks), by instruction: ld.shared / st.shared (vector width x element size),
    ldmatrix (4 B a thread per 8x8 b16 matrix) and cp.async (the bytes it writes). The tensor
    cores' own operand reads (wgmma from shared memory) are not in it: see loop_mma_shapes."""
    lines = ptx.splitlines()
    out = {"ld_shared": 0, "st_shared": 0, "ldmatrix": 0, "cp_async": 0}
    best, most = None, -1
    for lo, hi in _loops(lines):
        macs = 0
        for line in lines[lo : hi + 1]:
            m = _MMA_SHAPE.search(line)
            if m:
                macs += int(m.group(2)) * int(m.group(3)) * int(m.group(4))
        if macs > most:
            best, most = (lo, hi), macs
    if best is None:
        return out
    for line in lines[best[0] : best[1] + 1]:
        m = _SHARED_ACCESS.search(line)
        if m:
            out[f"{m.group(1)}_shared"] += int(m.group(2) or 1) * int(m.group(3)) // 8
            continue
        m = _LDMATRIX.search(line)
        if m:
            out["ldmatrix"] += 4 * int(m.group(1))
            continue
        m = _CP_ASYNC.search(line)
        if m:
            out["cp_async"] += int(m.group(1), 0)
    return out


def issued_over_needed(macs: dict[str, int], num_warps: int, needed: int | None) -> float | None:
    """Tensor-core multiply-adds one CTA issues per loop trip over those its tile needs.

    Each warpgroup (4 warps) issues the loop's wgmma and each warp its mma.sync, so a CTA issues
    wgmma MACs x num_warps / 4 + mma MACs x num_warps. 1.0: nothing computed twice. None: the loop
    has no tensor-core instruction (fp32 dots on FMA units, or a kernel without a dot)."""
    issued = macs["wgmma"] * (num_warps // 4) + macs["mma"] * num_warps
    if not issued or not needed:
        return None
    return issued / needed


_SSA_DEF = re.compile(r"^\s*(%[\w.$-]+)(?::\d+)?\s*=\s*([\w.]+)\s*(.*)$")
_COPY = re.compile(r"\b(ttng\.async_tma_copy_global_to_local|ttg\.async_copy_global_to_local)\b(.*)$")
_MEMDESC = re.compile(r"!ttg\.memdesc<([\dx]+)x(\w+),")
_DOT = re.compile(r"=\s*(ttng\.warp_group_dot|tt\.dot|ttng\.warpgroup_dot)\s")
_RESULT_SHAPE = re.compile(r"->\s*tensor<([\dx]+)x\w+")
_ELT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i8": 1, "u8": 1, "f8E4M3FN": 1, "i32": 4, "i64": 8}


_LOAD_TYPE = re.compile(r":\s*tensor<([\dx]+)x!tt\.ptr<(\w+)>")


def _tensor_bytes(line: str) -> int:
    """Bytes of the tensor a tt.load line reads (its pointer tensor's shape and element type)."""
    found = _LOAD_TYPE.search(line)
    if not found:
        return 0
    n = _ELT_BYTES.get(found.group(2), 2)
    for d in found.group(1).split("x"):
        n *= int(d)
    return n


def _regions(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last) line of the body of every scf.for in an MLIR listing (braces matched)."""
    out = []
    for i, line in enumerate(lines):
        if "scf.for" not in line or not line.rstrip().endswith("{"):
            continue
        depth = 0
        for j in range(i, len(lines)):
            depth += lines[j].count("{") - lines[j].count("}")
            if depth == 0:
                out.append((i, j))
                break
    return out


def kv_pipeline(ttgir: str) -> dict:
    """How the compiled key loop stages its KV tiles, read from the TTGIR after Triton's pipeliner.

    The key loop is the scf.for holding the most dots of its own (not of a nested loop); its
    "value dot" is the one with the largest result (the [rows, r] accumulator). Its KV copies are
    the async copies (TMA or cp.async) in that loop; the buffer they fill is the largest shared
    allocation they write, of ``kv_buffers`` slots. The copies into it issued before the loop
    (the prologue) are the tiles prefetched ahead, ``prefetched``; ``tiles_in_flight`` counts the
    tiles resident or being copied while the value dot of tile i runs: tile i, the prefetched
    tiles i + 1 .. i + prefetched - 1, and tile i + prefetched too if its copy is issued in the
    loop before the value dot's wait. 1 means nothing is copied while a tile is multiplied.
    ``copy_before_value_wait`` says where that in-loop copy stands. Without async copies in the
    loop (loads through registers): kv_buffers 0, tiles_in_flight 1; without a loop of dots (the
    merges): all None."""
    lines = ttgir.splitlines()
    defs = {}
    for i, line in enumerate(lines):
        m = _SSA_DEF.match(line)
        if m:
            defs[m.group(1)] = (i, m.group(2), m.group(3))
    loops = _regions(lines)

    def own_dots(lo, hi):
        inner = [(a, b) for a, b in loops if lo < a and b < hi]
        return [k for k in range(lo, hi + 1) if _DOT.search(lines[k]) and not any(a <= k <= b for a, b in inner)]

    none = {"kv_buffers": 0, "prefetched": 0, "tiles_in_flight": 1, "copy_before_value_wait": None}
    best = max(loops, key=lambda ab: len(own_dots(*ab)), default=None)
    if best is None or not own_dots(*best):  # no key loop (a merge): nothing to say
        return {key: None for key in none}
    lo, hi = best
    dots = own_dots(lo, hi)

    def size(k):
        found = _RESULT_SHAPE.search(lines[k])
        n = 1
        for d in found.group(1).split("x") if found else ["0"]:
            n *= int(d)
        return n

    value = max(dots, key=size)
    found = _SSA_DEF.match(lines[value])
    waits = re.compile(rf"warp_group_dot_wait {re.escape(found.group(1) if found else '%?')}[\s,]")
    wait = next((k for k in range(value + 1, hi + 1) if waits.search(lines[k])), value)  # mma.sync: the dot

    def alloc_of(ref):  # follow memdesc views back to the local_alloc that owns them
        for _ in range(8):
            d = defs.get(ref)
            if d is None:
                return None
            if d[1] == "ttg.local_alloc":
                return ref
            nxt = re.match(r"(%[\w.$-]+)", d[2])
            if not nxt:
                return None
            ref = nxt.group(1)
        return None

    def copy_dest(line):
        m = _COPY.search(line)
        if not m:
            return None
        rest = m.group(2)
        if m.group(1).startswith("ttng"):  # %desc[%x, %y] %dest, %barrier, %pred
            rest = rest[rest.index("]") + 1 :] if "]" in rest else rest
            refs = re.findall(r"%[\w.$-]+", rest)
            return refs[0] if refs else None
        refs = re.findall(r"%[\w.$-]+", rest)  # %ptrs, %dest mask ...
        return refs[1] if len(refs) > 1 else None

    def alloc_bytes(ref):
        found = _MEMDESC.search(defs[ref][2])
        if not found:
            return 0, 0
        dims = [int(d) for d in found.group(1).split("x")]
        n = _ELT_BYTES.get(found.group(2), 2)
        for d in dims:
            n *= d
        return n, dims[0]

    in_loop = [(k, alloc_of(copy_dest(lines[k]))) for k in range(lo, hi + 1) if _COPY.search(lines[k])]
    in_loop = [(k, a) for k, a in in_loop if a]
    if not in_loop:
        return none
    kv = max({a for _, a in in_loop}, key=lambda a: alloc_bytes(a)[0])
    buffers = alloc_bytes(kv)[1]
    # a tile loaded straight into registers in the loop (tt.load), larger than any slot the copies
    # fill, is the KV tile itself read unpipelined (an fp8 tile widened in registers, say): the
    # copies then stage only a side operand, and nothing of the KV tile is in flight
    slot = alloc_bytes(kv)[0] // max(buffers, 1)
    if any(_tensor_bytes(lines[k]) > slot for k in range(lo, hi + 1) if re.search(r"=\s*tt\.load\s", lines[k])):
        return none
    start = defs[kv][0]
    prologue = sum(1 for k in range(start, lo) if _COPY.search(lines[k]) and alloc_of(copy_dest(lines[k])) == kv)
    before = any(k < wait for k, a in in_loop if a == kv)
    return {
        "kv_buffers": buffers,
        "prefetched": prologue,
        "tiles_in_flight": prologue + (1 if before else 0) if prologue else 1,
        "copy_before_value_wait": before,
    }


def sass_counts(sass: str) -> dict[str, int]:
    """Tensor-core and local-memory instructions in a SASS listing (opcodes, not operands)."""
    out = {}
    for op in ("HGMMA", "QGMMA", "HMMA", "LDL", "STL"):
        out[op] = len(re.findall(rf"\b{op}\b", sass))
    return out


def verdict(result: dict) -> str | None:
    """Why a compiled config must not be timed, or None when it may."""
    if result.get("error"):
        return f"does not compile: {result['error']}"
    limit = SMEM_LIMIT[ARCHS[result["arch"]]]
    if result["smem_bytes"] > limit:
        return f"needs {result['smem_bytes']} B of shared memory, over the {limit} B of {result['arch']}"
    if result["spill_bytes"]:
        return f"spills {result['spill_bytes']} B (stack {result['stack_bytes']} B)"
    return None


# ---- compiling (child process: needs Triton's JIT, not its interpreter) ---------------------------


def _build(case: Case):
    """(jit function, signature, constants, divisible-by-16 argument names, options, launch) for a
    case, built as the launcher launches it; launch holds what the report records of that launch
    (decode: variant, num_splits and out_dtype as mla_decode picks them)."""
    if case.kernel == "mla_decode":
        from mlactl.kernels import decode

        return decode.compile_spec(
            case.shape, case.config, case.r, case.dR, case.page, case.dtype, case.kv_dtype,
            capability=ARCHS[case.arch], **case.extra,
        )  # fmt: skip
    if case.kernel == "mla_prefill":
        from mlactl.kernels import prefill

        # the prefill writes its output once, unsplit: one split, in the activation dtype
        spec = prefill.compile_spec(case.config, case.dC, case.dR, case.dV, case.dtype)
        return (*spec, {"out_dtype": case.dtype, "num_splits": 1})
    if case.kernel == "merge_attn_states":
        from mlactl.kernels import merge

        return (*merge.compile_spec(case.config, case.dV, case.dtype), {"out_dtype": case.dtype})
    if case.kernel == "mla_sparse_decode":
        from mlactl.kernels import sparse_decode

        return sparse_decode.compile_spec(case.shape, case.config, case.r, case.dR, case.dtype, case.kv_dtype,
                                          **case.extra)  # fmt: skip
    raise ValueError(f"unknown kernel {case.kernel!r}; kernels: {', '.join(KERNELS)}")


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _ptxas_release(path: str) -> str | None:
    """'12.8' from `ptxas --version` ("Cuda compilation tools, release 12.8, V12.8.93")."""
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", text)
    return found.group(1) if found else None


def compile_one(case: Case) -> dict:
    """Compile one case in this process (TRITON_INTERPRET must be unset); never raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    from triton.compiler import ASTSource

    cap = ARCHS[case.arch]
    out = {
        "kernel": case.kernel,
        "shape": case.shape,
        "config": case.config,
        "arch": case.arch,
        "dtype": case.dtype,
        "kv_dtype": case.kv_dtype,
        "label": case.label,
        **{k: case.extra[k] for k in ("variant", "stage", "kv_scale") if k in case.extra},
        "smem_bytes": None,
        "registers": None,
        "spill_bytes": None,
        "stack_bytes": None,
        "warnings": [],
        "error": None,
    }
    try:
        fn, sig, consts, aligned, options, launch = _build(case)
        out.update(launch)  # decode: the stage-1 kernel (variant), its num_splits and out_dtype
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", cap, 32), options=options)
    except Exception as exc:  # a config the compiler rejects is a result, not a crash
        out["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        return out
    ptx = k.asm["ptx"]
    out["smem_bytes"] = int(k.metadata.shared)
    out.update(kv_pipeline(k.asm["ttgir"]))
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        # the same flags Triton's make_cubin passes, so the figures are those of its own build
        cmd = [get_ptxas(cap).path, "-lineinfo", "-v", "--regAllocOptLevel=2"]
        cmd += [f"--gpu-name={sm_arch_from_capability(cap)}", src, "-o", os.path.join(tmp, "k.o")]
        run = subprocess.run(cmd, capture_output=True, text=True)
        out.update(parse_ptxas_log(run.stderr + run.stdout))
        out["ptxas"] = os.path.basename(cmd[0])
        out["ptxas_version"] = _ptxas_release(cmd[0])
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as fh:
            fh.write(k.asm["cubin"])
        dis = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True)
        out["sass"] = sass_counts(dis.stdout) if dis.returncode == 0 else {}
    counts = loop_counts(ptx, {"wgmma": "wgmma.mma_async", "mma": "mma.sync"})
    out["loop_ops"] = loop_counts(ptx, LOOP_OPS)
    out["loop_mma_shapes"] = loop_mma_shapes(ptx)
    out["loop_shared_bytes_per_thread"] = loop_shared_bytes(ptx)
    out["wgmma_per_loop"], out["mma_per_loop"] = counts["wgmma"], counts["mma"]
    out["wgmma_total"] = ptx.count("wgmma.mma_async")
    out["wgmma_shapes"] = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
    out["num_warps"], out["num_stages"] = options.get("num_warps"), options.get("num_stages")
    macs = loop_mma_macs(ptx)
    needed = tile_macs_needed(case, consts)
    out["mma_macs_issued_per_loop"] = macs["wgmma"] * (out["num_warps"] // 4) + macs["mma"] * out["num_warps"]
    out["mma_macs_needed_per_loop"] = needed
    out["issued_mma_over_needed"] = issued_over_needed(macs, out["num_warps"], needed)
    return out


def tile_macs_needed(case: Case, consts: dict) -> int | None:
    """Multiply-adds one trip of the kernel's key loop needs: its tile's (row, key) pairs times
    one head's pair FLOPs / 2 (cost.py: absorb r + dR and r; expand dC + dR and dV); None for a
    kernel without a key loop (the merge)."""
    if "BLOCK_N" not in consts and "BLOCK_M" not in consts:  # a merge stage: no key loop
        return None
    if case.kernel in ("mla_decode", "mla_sparse_decode"):  # sparse: absorb's pair over a selected row
        rows, keys, path = consts["BLOCK_H"], consts["BLOCK_N"], "absorb"
    elif case.kernel == "mla_prefill":
        rows, keys, path = consts["BLOCK_M"], consts["BLOCK_N"], "expand"
    else:
        return None
    head = MLAConfig("one head", 0, 1, None, case.r, case.dC, case.dR, case.dV, 1)
    return rows * keys * CostModel(head).pair_flops(path) // 2


def compile_cases(cases: list[Case], timeout: float = 1800) -> list[dict]:
    """Compile cases in a child process without TRITON_INTERPRET; one result dict per case."""
    if not cases:
        return []
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its warning
    payload = json.dumps([asdict(c) for c in cases])
    run = subprocess.run(
        [sys.executable, "-m", "mlactl.tune.compile"],
        input=payload,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if run.returncode != 0:
        tail = run.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the compile stage failed: {tail[0]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def available() -> str | None:
    """None when this Triton can compile for NVIDIA targets here, else why not."""
    try:
        import triton

        if not os.path.exists(_tool("ptxas-blackwell")) and not os.path.exists(_tool("ptxas")):
            return f"this triton {triton.__version__} wheel has no ptxas"
        import triton.backends.nvidia  # noqa: F401
    except ImportError as exc:
        return f"triton with its NVIDIA backend is needed ({exc})"
    return None


# ---- which cases: each kernel's default and, if asked, its candidate configs ----------------------


def default_cases(cfg, kernels=KERNELS, arch: str = "sm_90", dtype: str = "bf16", kv_dtype: str = "bf16") -> list[Case]:
    """The launch config each launcher would pick on `arch` for the model's main shape bucket."""
    from mlactl.kernels import decode, merge, prefill

    cases = []
    dims = dict(arch=arch, dtype=dtype, r=cfg.r, dR=cfg.dR, dC=cfg.dC, dV=cfg.dV)
    for name in kernels:
        if name == "mla_decode":
            # the main bucket (B 128), and for the uniform schedule a second batch that takes the
            # other output: one split writes q's dtype directly (B 1024), several write fp32
            # partials (B 16); the balanced kernel writes both kinds in every launch
            shape = {"B": 128, "H": cfg.H, "S_q": 1, "ctx": 8192}
            shapes = [shape]
            main = decode.default_config(shape, cfg.r, cfg.dR, KV_PAGE, dtype, kv_dtype)
            if decode.default_variant(main, kv_dtype == "fp8") == "uniform":
                shapes.append({**shape, "B": 16 if main["num_splits"] == 1 else 1024})
            for shape in shapes:
                full = decode.default_config(shape, cfg.r, cfg.dR, KV_PAGE, dtype, kv_dtype)
                config = {k: v for k, v in full.items() if k != "num_splits"}  # launched with no split count
                cases.append(Case(name, shape, config, kv_dtype=kv_dtype, label="default", **dims))
                # and the merge that launch runs after stage 1 (several splits, or the balanced plan)
                if decode.default_variant(full, kv_dtype == "fp8") == "balanced" or full["num_splits"] > 1:
                    cases.append(Case(name, shape, config, kv_dtype=kv_dtype, label="default", extra={"stage": "merge"},
                                      **dims))  # fmt: skip
            if kv_dtype == "fp8":  # the scale as a Python float: KV_SCALE_FROM_PTR off, another compile
                full = decode.default_config(shapes[0], cfg.r, cfg.dR, KV_PAGE, dtype, kv_dtype)
                config = {k: v for k, v in full.items() if k != "num_splits"}
                cases.append(Case(name, shapes[0], config, kv_dtype=kv_dtype, label="default",
                                  extra={"kv_scale": "float"}, **dims))  # fmt: skip
        elif name == "mla_prefill":
            shape = {"H": cfg.H, "L": 4096}
            config = prefill.default_config(ARCHS[arch], cfg.dC + cfg.dR, cfg.dV, dtype, shape["L"])
            cases.append(Case(name, shape, config, kv_dtype=dtype, label="default", **dims))
        elif name == "merge_attn_states":
            shape = {"H": cfg.H, "T": 4096}
            config = merge.default_config(cfg.H, cfg.dV)
            cases.append(Case(name, shape, config, kv_dtype=dtype, label="default", **dims))
        elif name == "mla_sparse_decode":
            from mlactl.kernels import sparse_decode

            # decode of 64 requests, each query over its top-k rows (a DSA model's; else 2048)
            shape = {"B": 64, "H": cfg.H, "S_q": 1, "topk": cfg.topk or SPARSE_TOPK}
            config = sparse_decode.default_config(shape, kv_dtype)
            cases.append(Case(name, shape, config, kv_dtype=kv_dtype, label="default", **dims))
            if config["num_splits"] > 1:  # and the merge of its splits
                cases.append(Case(name, shape, config, kv_dtype=kv_dtype, label="default", extra={"stage": "merge"},
                                  **dims))  # fmt: skip
        else:
            raise ValueError(f"unknown kernel {name!r}; kernels: {', '.join(KERNELS)}")
    return cases


def candidate_cases(
    cfg, kernels=KERNELS, arch: str = "sm_90", dtype: str = "bf16", kv_dtype: str = "bf16"
) -> list[Case]:
    """Every config of `tune`'s search space for the same buckets as `default_cases`."""
    cases = []
    for d in default_cases(cfg, kernels, arch, dtype, kv_dtype):
        if d.extra:  # a merge stage or a second way of passing the scale: no search space of its own
            continue
        spec = space.KERNELS[d.kernel]
        for config in spec.space(cfg, d.shape, kv_dtype, dtype, SMEM_LIMIT[ARCHS[arch]]):
            if config == {k: d.config.get(k) for k in config}:
                continue  # the default, already listed
            # each candidate's own schedule (decode: default_variant of the config), not the default's
            cases.append(Case(**{**asdict(d), "config": config, "label": "candidate", "extra": {}}))
    return cases


def run_report(cfg, kernels, arch: str, dtype: str, kv_dtype: str, candidates: bool = False) -> list[dict]:
    """Compile the defaults (and the candidates) of `kernels`; each result gets its `verdict`."""
    why = available()
    if why:
        raise RuntimeError(why)
    cases = default_cases(cfg, kernels, arch, dtype, kv_dtype)
    if candidates:
        cases += candidate_cases(cfg, kernels, arch, dtype, kv_dtype)
    results = compile_cases(cases)
    for res in results:
        res["dropped"] = verdict(res)
    return results


def cuda_arch(device) -> str | None:
    """'sm_90' for an H100/H200 and so on: the compile stage's target for a CUDA device, else None."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return None
    major, _ = torch.cuda.get_device_capability(device)
    return {8: "sm_80", 9: "sm_90", 10: "sm_100"}.get(major)


def drop_by_compile(ctx, spec, shape: dict, candidates: list[dict], entry: dict, arch=None) -> list[dict]:
    """The candidates that compile for the GPU without spilling and fit its shared memory.

    Runs the compile stage (mlactl/tune/compile.py: Triton + ptxas, seconds per config, no launch)
    only for the Triton backend on a GPU it knows (or for `arch` given); each config dropped is
    recorded in entry["compile_dropped"] and ctx.skipped with its reason. If the stage itself
    cannot run, the candidates are kept and the reason is noted once.
    """
    arch = arch or (cuda_arch(ctx.device) if ctx.backend == "triton" else None)
    if arch is None or not candidates:
        return candidates
    why = available()
    cfg = ctx.cfg
    base = dict(arch=arch, dtype=ctx.dtype, kv_dtype=ctx.kv_dtype, r=cfg.r, dR=cfg.dR, dC=cfg.dC, dV=cfg.dV)
    cases = [Case(spec.name, shape, c, page=KV_PAGE, label="candidate", **base) for c in candidates]
    try:
        if why:
            raise RuntimeError(why)
        results = compile_cases(cases)
    except (RuntimeError, OSError, ValueError) as exc:
        ctx.skipped.append(f"{spec.name}: compile stage not run ({exc}); configs kept untested")
        return candidates
    kept, dropped = [], entry.setdefault("compile_dropped", [])
    for config, res in zip(candidates, results):
        reason = verdict(res)
        if reason is None:
            kept.append(config)
        else:
            dropped.append({"config": config, "reason": reason})
            ctx.skipped.append(f"{spec.name} {config}: dropped before timing, {reason}")
    return kept


def _main() -> None:
    cases = [Case(**c) for c in json.loads(sys.stdin.read())]
    print(json.dumps([compile_one(c) for c in cases]))


if __name__ == "__main__":
    _main()
