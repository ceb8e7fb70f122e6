"""The ``timerlc`` command line (LANGUAGE.md section 12).

Exit status: 0 success; 1 an error in the program (``FILE:LINE:COL: error: ...``);
2 a usage error; 3 a failure while running, or a bug of timerlc's (``timerlc: internal
error: ...``, one line; ``TIMERLC_DEBUG=1`` or ``run --debug`` shows the traceback).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

import click

from timerlc import __version__
from timerlc.diagnostics import ProgramError, RunError, Source, UsageError

# cuda-emu: the cuda backend's kernels run on the CPU through timerlc/cuda/emu.h (a
# debugging backend: docs/cuda.md)
BACKENDS = ("reference", "cpu", "cuda", "cuda-emu")
DEVICE_BACKENDS = ("cuda", "cuda-emu")
BACKEND_HELP = (
    "reference (the interpreter of the equations), cpu (LLVM kernels), cuda (CUDA kernels on "
    "a GPU through CuPy) or cuda-emu (the CUDA kernels on the CPU, for debugging)"
)
BUILD_PLAN = "plan.json"
BUILD_MANIFEST = "build.json"
BUILD_PROGRAM = "program.pdg.json"
BUILD_FORMAT = 1
BUILD_MARKER = ".timerlc-build"


class _Fail(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def _overrides(sets: tuple[str, ...], seed: int | None = None) -> dict[str, str]:
    from timerlc.frontend.configs import parse_override

    out: dict[str, str] = {}
    given: dict[str, str] = {}  # name -> the option that set it, for messages

    def put(name: str, value: str, option: str):
        if name in out and out[name] != value:
            raise _Fail(
                2,
                f"timerlc: error: {option} conflicts with {given[name]}: {name} is given two "
                "values",
            )
        out[name] = value
        given[name] = option

    for s in sets:
        try:
            name, value = parse_override(s)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--set") from None
        put(name, value, f"--set {s}")
    if seed is not None:
        put("seed", str(seed), f"--seed {seed}")
    return out


def _env_overrides(envs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for s in envs:
        if "=" not in s or not s.split("=", 1)[0].strip() or not s.split("=", 1)[1].strip():
            raise click.BadParameter(f"expected E=PLUGIN, got '{s}'", param_hint="--env")
        name, plugin = s.split("=", 1)
        out[name.strip()] = plugin.strip()
    return out


def _read_source(path: str) -> Source:
    p = Path(path)
    try:
        return Source(str(path), p.read_bytes().decode("utf-8-sig"))  # a BOM is dropped
    except OSError as e:
        raise _Fail(2, f"timerlc: error: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise _Fail(
            2,
            f"timerlc: error: cannot read {path}: it is not UTF-8 text "
            f"(byte 0x{e.object[e.start]:02x} at offset {e.start})",
        ) from None


def _check(
    source: Source, overrides: dict[str, str], envs: dict[str, str], on_stage=None, optimize=True
):
    """Check the program and run the pass pipeline: the PDG a backend runs (the reference
    backend runs it unoptimized: it is the oracle the optimized program is tested against)."""
    from timerlc import compiler

    def work():
        return compiler.run_passes(
            compiler.check_program(source, overrides, envs), on_stage, optimize
        )

    return _on_deep_stack(source, work)


def _on_deep_stack(source: Source, work):
    """``work()``, a compile of ``source`` (the command runs on a deep stack: ``_guard``);
    a program error exits 1."""
    try:
        return work()
    except ProgramError as e:
        raise _Fail(1, e.render(source)) from None


def _compile(
    source: Source,
    overrides: dict[str, str],
    envs: dict[str, str],
    backend: str,
    memory_budget=None,
    on_stage=None,
    source_path=None,
):
    """Every stage for ``backend`` (``compiler.compile_source``): the graph it runs, its
    plan and the text of its kernel file (None, None for the reference backend); a program
    error exits 1, a budget that cannot be met warns."""
    from timerlc import compiler

    graph, plan, code = _on_deep_stack(
        source,
        lambda: compiler.compile_source(
            source,
            overrides,
            envs,
            backend=backend,
            memory_budget=memory_budget,
            on_stage=on_stage,
            source_path=source_path,
        ),
    )
    if plan is not None:
        _warn_budget(plan)
    return graph, plan, code


def _backend(backend: str | None) -> str:
    # LANGUAGE.md 12 makes cuda the default where a GPU can be used: it stays cpu until the
    # device runtime has passed the differential suite on a GPU (docs/cuda.md)
    return backend or "cpu"


def _device(backend: str, matmul: str = "float32"):
    """The device of a device backend (``runtime.cuda``), its float32 products as
    ``--matmul-precision`` says, or None for the others (where anything but float32 is a
    usage error, exit 2); a device that is not here is a usage error (exit 2) in one line."""
    if backend not in DEVICE_BACKENDS:
        if matmul != "float32":
            raise _Fail(
                2,
                f"timerlc: error: --matmul-precision {matmul} is for the cuda backends (the "
                f"{backend} backend computes float32 products in float32)",
            )
        return None
    from timerlc.runtime.cuda import DeviceUnavailable, device_for

    try:
        return device_for(backend, matmul)
    except DeviceUnavailable as e:
        raise _Fail(2, f"timerlc: error: the {backend} backend cannot run here: {e}") from None


def _guard(fn):
    """Run a command body, turning timerlc errors into messages and exit statuses."""

    def wrapper(*args, debug=False, **kwargs):
        from timerlc import deepstack

        try:
            return deepstack.call(fn, *args, **kwargs)
        except deepstack.TooDeep:
            if debug:
                traceback.print_exc()
            click.echo(
                "timerlc: error: the program is nested too deeply (split long expressions "
                "into several equations or defs)",
                err=True,
            )
            sys.exit(1)
        except _Fail as f:
            click.echo(f.text, err=True)
            sys.exit(f.status)
        except UsageError as e:
            click.echo(f"timerlc: error: {e}", err=True)
            sys.exit(2)
        except RunError as e:
            if debug:
                traceback.print_exc()
            click.echo(f"timerlc: run failed: {e}", err=True)
            sys.exit(3)
        except deepstack.Terminated:
            click.echo("timerlc: terminated (SIGTERM)", err=True)
            sys.exit(143)
        except KeyboardInterrupt:
            click.echo("timerlc: interrupted", err=True)
            sys.exit(130)
        except MemoryError as e:  # (a run's own are RunErrors: runner.run_plan)
            if debug:
                traceback.print_exc()
            click.echo(f"timerlc: error: out of memory{f': {e}' if str(e) else ''}", err=True)
            sys.exit(3)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own: a bad option value is a usage error (exit 2), as click says
        except Exception as e:  # noqa: BLE001 - a bug of timerlc's own
            shown = debug or bool(os.environ.get("TIMERLC_DEBUG"))
            if shown:
                traceback.print_exc()
            where = "" if shown else " (TIMERLC_DEBUG=1 shows the traceback)"
            click.echo(
                f"timerlc: internal error: {type(e).__name__}: {e}; this is a bug in timerlc, "
                f"not in your program; please report it{where}",
                err=True,
            )
            sys.exit(3)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``SIZE``: bytes, or a number with a K, M or G suffix (powers of 1024): ``64M``,
    ``1.5G``, ``4096``; an optional ``B``/``iB`` may follow the suffix (``64MiB``)."""

    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMG]?)(?:I?B)?\s*", str(text).upper())
    if m is None or (not m.group(2) and "." in m.group(1)):
        raise ValueError(
            f"'{text}' is not a size: give a number of bytes, optionally with a K, M or G "
            "suffix (powers of 1024), e.g. 64M"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


class _Seed(click.ParamType):
    """An int written as RTL writes one: ASCII decimal digits (click's INT also takes
    ``1_6`` and full-width digits, as Python's ``int`` does)."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not (text.isascii() and re.fullmatch(r"[+-]?[0-9]+", text)):
            self.fail(f"'{value}' is not an integer written with ASCII digits", param, ctx)
        return int(text)


class _Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


_budget_option = click.option(
    "--memory-budget",
    "memory_budget",
    type=_Size(),
    default=None,
    metavar="SIZE",
    help="Device memory the plan's buffers may hold at once (bytes, or with a K, M or G "
    "suffix: 64M); blocks unused for long are swapped to host memory to stay within it "
    "(compiled backends).",
)


def _check_budget(memory_budget, backend: str):
    if memory_budget is not None and backend == "reference":
        raise _Fail(
            2,
            f"timerlc: error: --memory-budget applies to a compiled plan; the {backend} "
            "backend has none (use --backend cpu or cuda)",
        )


def _warn_budget(plan):
    from timerlc.runner import budget_warning

    text = budget_warning(plan)
    if text is not None:
        click.echo(text, err=True)


_set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="K=V",
    help="Override a config, e.g. --set T=500 (repeatable).",
)
_env_option = click.option(
    "--env",
    "envs",
    multiple=True,
    metavar="E=PLUGIN",
    help="Bind environment E to a plugin (repeatable).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="timerlc")
def cli():
    """timerlc compiles deep-RL training programs written in RTL (.rtl files) and runs them."""


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@_set_option
@_env_option
def check(file, sets, envs):
    """Parse and check FILE; print nothing and exit 0 when it is valid. FILE may also be an
    environment written in RTL (docs/envs.md): --set then sets its configs."""

    def body():
        from timerlc.frontend import envrtl

        source = _read_source(file)
        if _on_deep_stack(source, lambda: envrtl.is_env_file(source.text)):
            if envs:
                raise _Fail(2, "timerlc: error: --env applies to programs, not environment files")
            _on_deep_stack(source, lambda: envrtl.check_file(source, _overrides(sets)))
            return
        _check(source, _overrides(sets), _env_overrides(envs), optimize=False)

    _guard(body)()


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "-o",
    "--output",
    "out_dir",
    default="build",
    show_default=True,
    help="The build folder to write.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help=f"Target backend: {BACKEND_HELP}; default cpu.",
)
@_set_option
@_env_option
@_budget_option
@click.option("--dump-ir", is_flag=True, help="Also write the IR after every stage to DIR/ir/.")
@click.option("--timings", is_flag=True, help="Print how long each compile stage took.")
def compile(file, out_dir, backend, sets, envs, memory_budget, dump_ir, timings):
    """Compile FILE into a build folder (the checked program and, with --dump-ir, its IR)."""

    def body():
        from timerlc.files import write_text
        from timerlc.ir import serialize

        source = _read_source(file)
        chosen = _backend(backend)
        _check_budget(memory_budget, chosen)
        stages: list[tuple[str, float, object]] = []
        started = time.perf_counter()

        def on_stage(name, g):
            stages.append((name, time.perf_counter(), g))

        graph, plan, code = _compile(
            source,
            _overrides(sets),
            _env_overrides(envs),
            chosen,
            memory_budget,
            on_stage,
            str(Path(file).resolve()),
        )
        out = _build_folder(Path(out_dir))
        write_text(out / BUILD_PROGRAM, serialize.to_json(graph))
        if plan is not None:
            from timerlc.plan import items

            (out / "kernels").mkdir(exist_ok=True)
            write_text(out / plan.kernels.file, code)
            write_text(out / BUILD_PLAN, items.dumps(plan))
            if chosen == "cpu":
                # the machine code for this CPU, so that a run of the build starts at once
                from timerlc.runtime.native import NativeModule, roots_of

                NativeModule(code, out / "kernels", roots_of(plan), threads=False)
                on_stage("llvm", None)
        manifest = {
            "format_version": BUILD_FORMAT,
            "timerlc": __version__,
            "source": str(Path(file).resolve()),
            "backend": chosen,
            "program": BUILD_PROGRAM,
            "overrides": _overrides(sets),
        }
        if dump_ir:
            ir = out / "ir"
            ir.mkdir(exist_ok=True)
            passes = [(name, g) for name, _, g in stages if hasattr(g, "nodes")]
            for k, (name, g) in enumerate(passes):
                write_text(ir / f"{k:02d}-{name}.pdg", serialize.to_text(g))
            if plan is not None:  # the schedule and memory decisions, readable
                from timerlc.plan import text as plan_text

                write_text(ir / f"{len(passes):02d}-plan.txt", plan_text.render(plan))
                from timerlc.codegen.generate import listing

                gen = next(g for name, _, g in stages if name == "kernels")
                write_text(ir / f"{len(passes) + 1:02d}-kernels.txt", listing(gen))
        # last: a build folder without its manifest (a compile stopped half way) is no build
        write_text(out / BUILD_MANIFEST, json.dumps(manifest, indent=2) + "\n")
        if timings:
            last = started
            for name, at, g in stages:
                if g is None:
                    size = "machine code"
                elif hasattr(g, "nodes"):
                    size = f"{len(g.nodes)} nodes"
                elif hasattr(g, "trees"):  # the generated code
                    size = (
                        f"{len(g.kernels)} kernels, {len(g.fused)} fused, "
                        f"{len(g.trees)} tree functions"
                    )
                else:
                    size = f"{len(g.statements)} statements"
                click.echo(f"{name:12s} {1000 * (at - last):8.1f} ms  ({size})", err=True)
                last = at
            click.echo(f"{'total':12s} {1000 * (time.perf_counter() - started):8.1f} ms", err=True)

    _guard(body)()


def _is_build(path: Path) -> bool:
    """Whether the folder holds a timerlc build: its marker file, or (a build of an earlier
    timerlc) a manifest that a compile wrote."""
    if (path / BUILD_MARKER).is_file():
        return True
    try:
        manifest = json.loads((path / BUILD_MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and {"format_version", "timerlc", "program"} <= set(manifest)


def _build_folder(out: Path) -> Path:
    """``out`` made ready for a build: made if missing; refused (exit 2) if it holds files
    and is not a timerlc build (a compile never writes into, or deletes from, a folder of
    someone else's files); an earlier build's files are removed, so that nothing of it is
    run or inspected by mistake, the manifest first (a build without one is no build)."""
    try:
        if out.exists() and not out.is_dir():
            raise _Fail(2, f"timerlc: error: -o {out}: it is a file, not a folder")
        if out.is_dir() and any(out.iterdir()) and not _is_build(out):
            raise _Fail(
                2,
                f"timerlc: error: -o {out}: the folder is not empty and holds no timerlc build "
                f"(no {BUILD_MARKER} file); give an empty or new folder",
            )
        out.mkdir(parents=True, exist_ok=True)
        for name in (BUILD_MANIFEST, BUILD_PLAN, BUILD_PROGRAM):
            (out / name).unlink(missing_ok=True)
        for folder in ("ir", "kernels"):
            if (out / folder).is_dir():
                shutil.rmtree(out / folder)
        marker = out / BUILD_MARKER
        if not marker.is_file():
            marker.write_text("This folder is a timerlc build; timerlc compile may replace it.\n")
    except OSError as e:
        raise _Fail(
            2, f"timerlc: error: cannot write the build folder {out}: {e.strerror or e}"
        ) from None
    return out


def _load_build(path: Path):
    """The checked program of a build folder (its manifest names the file): a file that is
    not one a compile writes is a usage error (exit 2), never code run or a traceback."""
    from timerlc.ir import serialize
    from timerlc.ir.verify import VerifyError, verify
    from timerlc.plan.expr import clip

    try:
        manifest = json.loads((path / BUILD_MANIFEST).read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise _Fail(2, f"timerlc: error: {path} is not a timerlc build folder ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("program"), str):
        raise _Fail(
            2, f"timerlc: error: {path} is not a timerlc build folder (see its {BUILD_MANIFEST})"
        )
    if manifest.get("format_version") != BUILD_FORMAT:
        raise _Fail(
            2,
            f"timerlc: error: {path} was built with build format {manifest.get('format_version')}; "
            f"this timerlc reads format {BUILD_FORMAT}. Recompile the program.",
        )
    program = path / manifest["program"]
    try:
        graph = serialize.from_json(program.read_text())
        verify(graph, lowered=True)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise _Fail(2, f"timerlc: error: cannot load {program}: {clip(str(e))}") from None
    except (RecursionError, VerifyError) as e:
        what = "nested too deeply" if isinstance(e, RecursionError) else str(e).split("\n")[0]
        raise _Fail(2, f"timerlc: error: cannot load {program}: {clip(what)}") from None
    return graph


def _run_build(
    path: Path,
    backend,
    outputs_path,
    metrics_path,
    progress,
    profile,
    allow_nonfinite,
    matmul="float32",
):
    """Run a build folder: its plan on the cpu runtime, or its checked program on the
    reference interpreter (``--backend reference``, or a build for that backend, which has
    no plan)."""
    from timerlc.runner import run_plan, run_reference
    from timerlc.runtime.plan import PlanError, load_kernels, load_plan

    plan_file = path / BUILD_PLAN
    if not (path / BUILD_MANIFEST).is_file():
        raise _Fail(
            2,
            f"timerlc: error: {path} is not a timerlc build folder (it has no {BUILD_MANIFEST}; "
            "a compile that was stopped writes it last)",
        )
    if backend == "reference" or not plan_file.exists():
        graph = _load_build(path)
        if backend not in (None, "reference"):
            raise _Fail(
                2,
                f"timerlc: error: {path} was compiled for the reference backend (it has no "
                f"{BUILD_PLAN}); compile the program again with --backend {backend}",
            )
        run_reference(graph, outputs_path, metrics_path, progress, profile, allow_nonfinite)
        return
    try:
        plan = load_plan(plan_file)
        code = load_kernels(path, plan)
    except PlanError as e:
        raise _Fail(2, f"timerlc: error: {e}") from None
    built = "cuda" if plan.kernels is not None and plan.kernels.file.endswith(".cu") else "cpu"
    backend = backend or built
    if (backend in DEVICE_BACKENDS) != (built == "cuda"):
        raise _Fail(
            2,
            f"timerlc: error: {path} was compiled for the {built} backend; compile the program "
            f"again with --backend {backend}",
        )
    device = _device(backend, matmul)
    try:
        # (the cpu's machine code; cuda-emu's module, compiled by the host; a GPU's module
        # is kept by CuPy's own cache)
        cache = path / "kernels" if code is not None else None
        run_plan(
            plan,
            outputs_path,
            metrics_path,
            progress,
            profile,
            allow_nonfinite,
            code,
            cache,
            device,
        )
    except PlanError as e:  # found while running: a read outside the buffers
        raise _Fail(2, f"timerlc: error: {plan_file}: {e}") from None


@cli.command()
@click.argument("target", type=click.Path())
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help=f"Backend: {BACKEND_HELP}; default cpu, or the backend a build folder was compiled for.",
)
@_set_option
@_env_option
@click.option(
    "--seed",
    type=_Seed(),
    default=None,
    help="The seed of all random streams (overrides config seed).",
)
@click.option(
    "--outputs",
    "outputs_path",
    type=click.Path(dir_okay=False),
    help="Save the `out` tensors to F.npz.",
)
@click.option(
    "--metrics",
    "metrics_path",
    type=click.Path(dir_okay=False),
    help="Stream metrics to F.csv or F.jsonl.",
)
@_budget_option
@click.option(
    "--allow-nonfinite",
    is_flag=True,
    help="Accept NaN and infinite observations and rewards from environments (by default "
    "they stop the run with exit 3).",
)
@click.option(
    "--matmul-precision",
    "matmul",
    type=click.Choice(["float32", "tensorfloat32"]),
    default="float32",
    show_default=True,
    help="How the cuda backends compute float32 products (the BLAS's and timerlc's own "
    "kernels): float32, or tensorfloat32 (TF32 tensor cores, from NVIDIA Ampere on: "
    "operands rounded to 10 bits of mantissa, as JAX's default there; faster, less exact).",
)
@click.option("--no-progress", is_flag=True, help="Do not show the progress line.")
@click.option("--profile", is_flag=True, help="Print where the run spent its time.")
@click.option("--debug", is_flag=True, help="Show tracebacks of failures.")
def run(
    target,
    backend,
    sets,
    envs,
    seed,
    outputs_path,
    metrics_path,
    memory_budget,
    allow_nonfinite,
    matmul,
    no_progress,
    profile,
    debug,
):
    """Run TARGET, a program FILE.rtl or a build folder, and save outputs and metrics.

    A program run again with the same options loads the build its last run kept instead
    of compiling it again (TIMERLC_BUILD_CACHE=0: compile each time)."""

    def body():
        from timerlc.runner import run_plan, run_reference

        path = Path(target)
        chosen = _backend(backend)
        _check_budget(memory_budget, chosen)
        device = _device(chosen, matmul) if not path.is_dir() else None
        if metrics_path and not metrics_path.endswith((".csv", ".jsonl")):
            raise click.BadParameter(
                "the metrics file must end in .csv or .jsonl", param_hint="--metrics"
            )
        if outputs_path and not outputs_path.endswith(".npz"):
            raise click.BadParameter("the outputs file must end in .npz", param_hint="--outputs")
        from timerlc import files

        for option, file in (("--outputs", outputs_path), ("--metrics", metrics_path)):
            if file:
                files.probe_writable(file, option)
        progress = not no_progress and sys.stderr.isatty()
        if path.is_dir():
            if sets or envs or seed is not None:
                raise _Fail(
                    2,
                    "timerlc: error: --set, --env and --seed change the program; recompile it "
                    "instead",
                )
            if memory_budget is not None:
                raise _Fail(
                    2,
                    "timerlc: error: --memory-budget changes the plan; compile the program "
                    "with it instead (timerlc compile FILE.rtl --memory-budget SIZE)",
                )
            _run_build(
                path,
                backend,
                outputs_path,
                metrics_path,
                progress,
                profile,
                allow_nonfinite,
                matmul,
            )
            return
        source = _read_source(target)
        overrides, bound = _overrides(sets, seed), _env_overrides(envs)
        from timerlc import buildcache

        key = kept = None
        if chosen != "reference" and buildcache.enabled():
            # (the build of an unchanged program, kept by an earlier run: no compile)
            key = buildcache.key(target, source.text, overrides, bound, chosen, memory_budget)
            kept = buildcache.lookup(key)
        if kept is not None:
            entry, plan, code = kept
            _warn_budget(plan)
        else:
            graph, plan, code = _compile(source, overrides, bound, chosen, memory_budget)
            if plan is None:
                run_reference(
                    graph, outputs_path, metrics_path, progress, profile, allow_nonfinite
                )
                return
            entry = buildcache.store(key, plan, code, source, bound) if key is not None else None
        from timerlc.runtime.native import shared_cache
        from timerlc.runtime.plan import PlanError

        # (the cpu's machine code, kept with the build, else in the user's cache: the same
        # program run again loads it; cuda-emu keeps its own module there, a GPU's is CuPy's)
        cache = None
        if code is not None and device is None:
            cache = entry / "kernels" if entry is not None else shared_cache()
        try:
            run_plan(
                plan,
                outputs_path,
                metrics_path,
                progress,
                profile,
                allow_nonfinite,
                code,
                cache,
                device=device,
            )
        except PlanError as e:  # (the plan just compiled: the compiler's error, not the user's)
            raise RunError(f"internal error: {e}") from e

    _guard(body)(debug=debug)


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "dot"]),
    default="text",
    show_default=True,
)
def inspect(file, fmt):
    """Show a dumped IR file (.pdg text or .json) or a plan (plan.json) in readable form."""

    def body():
        from timerlc.ir import serialize
        from timerlc.runtime.plan import MAX_PLAN_BYTES

        if Path(file).stat().st_size > MAX_PLAN_BYTES:  # refused unread, as `run` does
            raise _Fail(2, f"timerlc: error: {file} is too large for a timerlc IR dump or plan")
        try:
            text = Path(file).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise _Fail(
                2, f"timerlc: error: {file} is not a timerlc IR dump or plan (not text)"
            ) from None
        from timerlc.codegen.generate import LISTING_HEAD
        from timerlc.plan import text as plan_text

        if text.startswith(LISTING_HEAD):  # kernels dumped as text (build/ir/NN-kernels.txt)
            if fmt != "text":
                raise _Fail(
                    2, f"timerlc: error: {file} is a kernel listing: it has only a text form"
                )
            click.echo(text, nl=False)
            return
        if text.startswith(plan_text.HEAD):  # a plan dumped as text (build/ir/NN-plan.txt)
            if fmt != "text":
                raise _Fail(
                    2,
                    f"timerlc: error: {file} is a plan's text form; inspect the build's "
                    f"plan.json for --format {fmt}",
                )
            click.echo(text, nl=False)
            return
        plan = _as_plan(text, file)
        if plan is not None:
            from timerlc.plan import items

            if fmt == "dot":
                raise _Fail(2, "timerlc: error: a plan has no dot form (use text or json)")
            if fmt == "text":
                shown = plan_text.render(plan)
            else:
                shown = json.dumps(items.to_json(plan), indent=1) + "\n"
            click.echo(shown, nl=False)
            return
        try:
            graph = (
                serialize.from_json(text)
                if text.lstrip().startswith("{")
                else serialize.from_text(text)
            )
        except ValueError as e:
            raise _Fail(2, f"timerlc: error: {file} is not a timerlc IR dump: {e}") from None
        except RecursionError:
            raise _Fail(
                2, f"timerlc: error: {file} is not a timerlc IR dump: nested too deeply"
            ) from None
        render = {"text": serialize.to_text, "json": serialize.to_json, "dot": serialize.to_dot}[
            fmt
        ]
        click.echo(render(graph), nl=False)

    _guard(body)()


def _as_plan(text: str, file: str):
    """The plan in ``text`` if it is one (a JSON object with a plan's keys), checked, else
    None; a plan that is not valid is a usage error (exit 2)."""
    from timerlc.plan import items

    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    except RecursionError:
        raise _Fail(
            2, f"timerlc: error: {file} is not a timerlc IR dump or plan: JSON nested too deeply"
        ) from None
    if isinstance(data, dict) and {"format_version", "statements", "tree"} <= data.keys():
        try:
            return items.from_json(data, file)
        except items.PlanError as e:
            raise _Fail(2, f"timerlc: error: {e}") from None
    return None


@cli.command("envs")
def list_envs():
    """List the environment plugins that can be found."""
    from timerlc.envs import available

    rows = available()
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        click.echo(f"{name:<{width}}  {text}")


def main():
    """The console script (``timerlc``, ``python -m timerlc``): the command, then the
    process ends at once (``os._exit``) with its exit status, its output flushed. A
    command has closed what it wrote (metrics, outputs, a build) before it returns, so
    what the interpreter's own exit would do after it is only taking the process's objects
    apart one by one: 0.2 s after a compile (the front end's sympy and isl objects, the
    graphs, the plan), of `timerlc compile programs/ppo.rtl`'s 1.8. An exception that is
    not an exit (a bug click does not catch) leaves as Python's exits do, and so does any
    exit under a profiler or a tracer (``python -m cProfile -m timerlc``, coverage)."""
    try:
        cli(prog_name="timerlc")
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # (as sys.exit does with a message)
        print(code, file=sys.stderr)
        code = 1
    if sys.gettrace() is not None or sys.getprofile() is not None:
        sys.exit(code)  # (a profiler or a coverage tool writes its data at the exit)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # (a closed pipe: nothing more can be said there)
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
