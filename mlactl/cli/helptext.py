"""One pass over every command's options before its help is shown, so that all commands read alike.

* A value's kind in its metavar (INT, RANGE, PATH, ...) instead of a bare `<str>`: most options
  are typed `str` so that `32K` and `1:4096:*2` parse in mlactl, not in click.
* An option whose help already says "(default: ...)" does not get click's "[default: ...]" too.
* A required argument in the usage line as `REQUESTS.CSV`, not typer's `{requests}`.
* `--install-completion` and `--show-completion` on the root command only (`mlactl
  --install-completion`): a sub-command group (tune, plot) should not offer them again.
"""

from __future__ import annotations

METAVARS = {
    "model": "NAME|PATH",
    "hardware": "NAME|PATH",
    "tp": "INT",
    "batch": "RANGE",
    "new": "RANGE",
    "prefix": "RANGE",
    "context": "RANGE",
    "kv_dtype": "DTYPE",
    "dtype": "DTYPE",
    "chunk": "INT",
    "layers": "INT|all",
    "engines": "ENGINES",
    "engine_option": "[ENGINE.]KEY=VALUE",
    "max_new": "INT",
    "policy": "POLICY",
    "fmt": "FORMAT",
    "output": "PATH",
    "results": "PATH",
    "results_file": "PATH",
    "space": "PATH",
    "budget": "SECONDS",
    "backend": "BACKEND",
    "device": "DEVICE",
    "kernel": "NAME",
    "bucket": "BUCKET",
    "requests": "REQUESTS.CSV",
    "workload": "WORKLOAD.CSV",
    "dpi": "INT",
    "data": "PATH",
    "calibration": "NAME|PATH",
    "files": "FILE...",
    "source": "SOURCE",
    "system": "SYSTEM",
    "framework": "FRAMEWORK",
    "framework_version": "VERSION",
    "data_dir": "DIR",
    "name": "NAME",
    "out_dir": "DIR",
    "arch": "ARCH",
    "workers": "INT",
    "terms": "TERM,...",
    "test": "PATH",
    "trace": "TRACE",
    "report": "REPORT.JSON",
    "weight_dtype": "DTYPE",
    "max_batch_tokens": "INT",
    "max_running": "INT",
    "mem_fraction": "FRACTION",
    "cache_tokens": "INT",
    "step_overhead_ms": "MS",
    "jobs": "INT",
    "scope": "SCOPE",
}
COMPLETION = ("install_completion", "show_completion")


# a docstring line that starts one of these begins a line of its own in --help (an example, a
# list item), as does a parenthesised line after an example (a second one); any other line
# continues its paragraph
OWN_LINE = ("Example", "mlactl ", "- ", "* ")


def reflow(text: str) -> str:
    """A docstring's paragraphs as rich prints them: each one line, wrapped to the terminal
    (rich keeps a docstring's line breaks, which fold mid-sentence on any other width)."""
    out = []
    for para in text.split("\n\n"):
        lines: list[str] = []
        for line in para.splitlines():
            line = line.strip()
            after_example = bool(lines) and lines[-1].startswith(("Example", "(")) and line.startswith("(")
            if lines and line and not line.startswith(OWN_LINE) and not after_example:
                lines[-1] += " " + line
            elif line:
                lines.append(line)
        out.append("\n".join(lines))
    return "\n\n".join(out)


def polish(command) -> None:
    """Set metavars and default display on `command` and every sub-command, once; reflow its help."""
    if getattr(command, "_mlactl_polished", False):
        return
    command._mlactl_polished = True
    if command.help:
        command.help = reflow(command.help)
    command.params = [p for p in command.params if p.name not in COMPLETION]
    for param in command.params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        if param.metavar is None and param.name in METAVARS:
            param.metavar = METAVARS[param.name]
            if param.param_type_name == "argument":  # typer would print a required one as {NAME}
                param.make_metavar = lambda ctx=None, usage=False, name=param.metavar: name
        help_text = getattr(param, "help", None) or ""
        if "(default" in help_text and hasattr(param, "show_default"):
            param.show_default = False
    for sub in getattr(command, "commands", {}).values():
        polish(sub)
