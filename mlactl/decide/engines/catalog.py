"""`mlactl engines --list`: every rule set, its backends, its default backend per GPU
architecture and cache dtype, its options with their defaults, and its source."""

from __future__ import annotations

from dataclasses import asdict

from mlactl.decide.engines.params import Context, resolve
from mlactl.decide.engines.rulesets import NEWEST, RULESETS, SHORTHANDS, RuleSet
from mlactl.util.errors import MlactlError

ARCHS = ("sm80", "sm89", "sm90", "sm100", "sm120")
CACHES = ("bf16", "fp8")
# The default of the model mlactl names first (DeepSeek-V3: DeepseekV3ForCausalLM, qk_nope 128)
MODEL = "deepseek-v3"
# ... and of its DSA model, DeepSeek-V3.2 (index_topk 2048) on one GPU
DSA = dict(model="deepseek-v3.2", model_kind="dsa", model_arch="DeepseekV32ForCausalLM", index_topk=2048)


def defaults_of(rs: RuleSet, dsa: bool = False) -> list[dict]:
    """The backend the rule set resolves to on each architecture and cache dtype (DeepSeek-V3, or
    with `dsa` DeepSeek-V3.2), or the reason none does."""
    out = []
    for arch in ARCHS:
        for kv in CACHES:
            ctx = Context(hardware=arch, arch=arch, kv_dtype=kv, **(DSA if dsa else {"model": MODEL}))
            try:
                p = resolve(rs.name, {}, ctx)
                out.append(
                    {"arch": arch, "kv_dtype": kv, "backend": p.backend, "threshold": p.threshold, "why": p.why[0]}
                )
            except MlactlError as exc:  # a combination the engine has no backend for
                out.append({"arch": arch, "kv_dtype": kv, "backend": None, "threshold": None, "why": str(exc)})
    return out


def catalog() -> list[dict]:
    """Every rule set as plain data, newest first within an engine."""
    out = []
    for name, rs in RULESETS.items():
        out.append(
            {
                "name": name,
                "engine": rs.engine,
                "version": rs.version,
                "newest": NEWEST.get(rs.engine) == name,
                "source": {
                    "repo": rs.source.repo,
                    "commit": rs.source.commit,
                    "files": [list(f) for f in rs.source.files],
                    "note": rs.source.note,
                },
                "backends": {k: asdict(b) for k, b in rs.backends.items()},
                "defaults": defaults_of(rs),
                "model_kinds": list(rs.model_kinds),
                "dsa_defaults": defaults_of(rs, dsa=True) if "dsa" in rs.model_kinds else None,
                "dsa_source": rs.dsa.source if rs.dsa is not None else None,
                "options": {
                    k: {
                        "type": o.kind.__name__,
                        "default": o.default,
                        "help": o.help,
                        "source": o.source,
                        "choices": list(o.choices),
                        "minimum": o.minimum if o.kind is int else None,
                        "maximum": o.maximum if o.kind is int else None,
                    }
                    for k, o in rs.options.items()
                },
                "aliases": dict(rs.aliases),
                "notes": list(rs.notes),
            }
        )
    return out


def shorthands() -> dict[str, str]:
    return {
        k: f"{NEWEST[f]} with " + ", ".join(f"{o}={v}" for o, v in fixed.items())
        for k, (f, fixed) in SHORTHANDS.items()
    }
