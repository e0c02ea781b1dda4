"""``layerlab explain-shape``: output-size arithmetic of conv/pool-type ops, step by step.

Never imports torch: everything comes from :mod:`layerlab.shapes`. Exit codes: 0 the shape is
fine, 1 torch would raise (or no setting reaches ``--target``), 2 malformed flags.
"""

from __future__ import annotations

from typing import Annotated, Any, Dict, Optional

import typer

from layerlab.cli import parse
from layerlab.cli.options import JsonOpt
from layerlab.errors import UsageError

_INT = "int or tuple (3, 3x5)"


def _opt(*names: str, help: str, meta: str = _INT):
    return typer.Option(*names, help=help, metavar=meta, show_default=False)


def command(
    op: Annotated[str, _opt("--op", help="Op: conv (default), conv_transpose, max_pool, avg_pool, lp_pool, "
                               "adaptive_avg_pool, adaptive_max_pool, fractional_max_pool, unfold, fold, upsample, "
                               "pixel_shuffle, pixel_unshuffle, flatten, patch_embed, reflection_pad, "
                               "replication_pad, circular_pad, constant_pad, zero_pad; add 1d/2d/3d or let --input "
                               "decide. Module semantics; an F. prefix (F.conv2d, F.interpolate) gives the "
                               "functional's.", meta="NAME")] = "conv",
    input: Annotated[Optional[str], _opt("--input", "-i", help="Input size: 32 (every spatial dim), 32x48, "
                                         "or a full shape 2,3,32,32. Omit it for a table of common sizes.",
                                         meta="SIZE")] = None,
    kernel_size: Annotated[Optional[str], _opt("--kernel-size", "--kernel", "-k", help="kernel_size.")] = None,
    stride: Annotated[Optional[str], _opt("--stride", "-s", help="stride (pools default to kernel_size).")] = None,
    padding: Annotated[Optional[str], _opt("--padding", "-p", help="padding: int, tuple, same or valid.",
                                           meta="PAD")] = None,
    dilation: Annotated[Optional[str], _opt("--dilation", "-d", help="dilation.")] = None,
    groups: Annotated[Optional[int], _opt("--groups", "-g", help="groups (conv).", meta="INT")] = None,
    in_channels: Annotated[Optional[int], _opt("--in-channels", help="in_channels (default: the input's C).",
                                               meta="INT")] = None,
    out_channels: Annotated[Optional[int], _opt("--out-channels", help="out_channels (default: in_channels).",
                                                meta="INT")] = None,
    padding_mode: Annotated[Optional[str], _opt("--padding-mode", help="zeros, reflect, replicate, circular.",
                                                meta="MODE")] = None,
    output_padding: Annotated[Optional[str], _opt("--output-padding", help="output_padding (conv_transpose).")] = None,
    output_size: Annotated[Optional[str], _opt("--output-size", help="output_size (adaptive pools, fold, "
                                               "conv_transpose forward); 'none' keeps a dim.", meta="SIZE")] = None,
    ceil_mode: Annotated[bool, typer.Option("--ceil-mode", help="ceil_mode=True (pools).")] = False,
    return_indices: Annotated[bool, typer.Option("--return-indices", help="return_indices=True (max pools).")] = False,
    count_include_pad: Annotated[Optional[bool], typer.Option("--count-include-pad/--no-count-include-pad",
                                                              help="count_include_pad (avg pools).",
                                                              show_default=False)] = None,
    divisor_override: Annotated[Optional[int], _opt("--divisor-override", help="divisor_override (avg pools).",
                                                    meta="INT")] = None,
    value: Annotated[Optional[float], _opt("--value", help="fill value (constant_pad).", meta="FLOAT")] = None,
    output_ratio: Annotated[Optional[str], _opt("--output-ratio", help="output_ratio (fractional_max_pool), "
                                                "e.g. 0.5 or 0.5x0.7.", meta="FLOAT")] = None,
    antialias: Annotated[bool, typer.Option("--antialias", help="antialias=True (F.interpolate).")] = False,
    norm_type: Annotated[Optional[float], _opt("--norm-type", help="norm_type (lp pools, default 2).",
                                               meta="FLOAT")] = None,
    size: Annotated[Optional[str], _opt("--size", help="size (upsample).", meta="SIZE")] = None,
    scale_factor: Annotated[Optional[str], _opt("--scale-factor", help="scale_factor (upsample), e.g. 2 or 0.29.",
                                                meta="FLOAT")] = None,
    mode: Annotated[Optional[str], _opt("--mode", help="upsample mode (nearest, bilinear, area, …).",
                                        meta="MODE")] = None,
    align_corners: Annotated[Optional[bool], typer.Option("--align-corners/--no-align-corners",
                                                          help="align_corners (upsample).",
                                                          show_default=False)] = None,
    upscale_factor: Annotated[Optional[int], _opt("--upscale-factor", help="pixel_shuffle factor.",
                                                  meta="INT")] = None,
    downscale_factor: Annotated[Optional[int], _opt("--downscale-factor", help="pixel_unshuffle factor.",
                                                    meta="INT")] = None,
    start_dim: Annotated[Optional[int], _opt("--start-dim", help="flatten start_dim.", meta="INT")] = None,
    end_dim: Annotated[Optional[int], _opt("--end-dim", help="flatten end_dim.", meta="INT")] = None,
    patch_size: Annotated[Optional[int], _opt("--patch-size", help="patch size (patch_embed).", meta="INT")] = None,
    embed_dim: Annotated[Optional[int], _opt("--embed-dim", help="embedding dim (patch_embed).", meta="INT")] = None,
    target: Annotated[Optional[str], _opt("--target", "-t", help="Inverse question: which padding (and stride, "
                                          "kernel if not given) reach this size? For conv_transpose: the "
                                          "output_padding / output_size.", meta="SIZE")] = None,
    undo: Annotated[Optional[str], _opt("--undo", help="conv_transpose: the output_padding that undoes a conv "
                                        "which took this size to --input.", meta="SIZE")] = None,
    chain: Annotated[Optional[str], _opt("--chain", "-c", help="Several ops, each fed by the previous output: "
                                         "'conv k=7 s=2 p=3 | maxpool k=3 s=2 p=1'.", meta="STAGES")] = None,
    torch_version: Annotated[Optional[str], _opt("--torch-version", help="Predict this torch version's behaviour "
                                                 "(default: the installed torch's, read without importing it). "
                                                 "Versions differ in a few error cases only, so --target/--undo "
                                                 "answers do not depend on it.", meta="X.Y.Z")] = None,
    json: JsonOpt = False,
) -> int:
    """Explain the output size of a conv/pool-type op, exactly as torch computes it.

    [b]Examples[/b]

      layerlab explain-shape --kernel 3 --stride 2
      layerlab explain-shape --input 32 --kernel 3 --stride 2
      layerlab explain-shape --op max_pool --input 5 --kernel 2 --ceil-mode
      layerlab explain-shape --input 32 --kernel 3 --target 32
      layerlab explain-shape --input 224 --chain "conv k=7 s=2 p=3 | maxpool k=3 s=2 p=1"
    """
    from layerlab.cli import render_shapes
    from layerlab.cli.output import Output

    out = Output(json_mode=json)
    raw = dict(
        kernel_size=kernel_size and parse.int_tuple(kernel_size, "--kernel-size", minimum=1),
        stride=stride and parse.int_tuple(stride, "--stride", minimum=1),
        padding=padding and parse.padding(padding),
        dilation=dilation and parse.int_tuple(dilation, "--dilation", minimum=1),
        groups=groups, in_channels=in_channels, out_channels=out_channels, padding_mode=padding_mode,
        output_padding=output_padding and parse.int_tuple(output_padding, "--output-padding", minimum=0),
        output_size=output_size and parse.output_size(output_size, "--output-size"),
        ceil_mode=ceil_mode or None, return_indices=return_indices or None,
        count_include_pad=count_include_pad, divisor_override=divisor_override, norm_type=norm_type,
        size=size and parse.int_tuple(size, "--size", minimum=1),
        scale_factor=scale_factor and parse.positive_float(scale_factor, "--scale-factor"),
        mode=mode, align_corners=align_corners, upscale_factor=upscale_factor,
        downscale_factor=downscale_factor, start_dim=start_dim, end_dim=end_dim, value=value,
        output_ratio=output_ratio and parse.positive_float(output_ratio, "--output-ratio"),
        antialias=antialias or None,
        patch_size=patch_size, embed_dim=embed_dim,
    )
    params: Dict[str, Any] = {k: v for k, v in raw.items() if v is not None}
    _check_positive(params)

    if torch_version is not None:
        from layerlab.shapes.torch_version import parse_version

        try:  # a malformed version is a usage error (exit 2) before any work
            parse_version(torch_version)
        except UsageError:
            raise UsageError(f"--torch-version {torch_version!r} is not a version", where="--torch-version",
                             expected="X.Y or X.Y.Z", got=torch_version, hint="e.g. --torch-version 2.13.0") from None
    if chain is not None:
        return _run_chain(out, chain, input, params, torch_version)
    from layerlab.shapes.ops import resolve

    n_spatial = None
    size_arg = parse.size_arg(input) if input is not None else None
    if size_arg is not None:
        # One bare number means "every spatial dim": let the op (or the 2-D default) decide nd.
        n_spatial = len(size_arg.dims) - 2 if size_arg.full else (len(size_arg.dims) if len(size_arg.dims) > 1 else None)
    spec = resolve(op, n_spatial=n_spatial)
    nd = spec.nd or n_spatial or 2
    if spec.family != "pad":  # a padding module's padding has 2·nd values (F.pad's order)
        _check_tuple_lengths(params, nd, spec.name)

    if size_arg is None:
        if target is not None or undo is not None:
            raise UsageError("--target and --undo need --input", where="--target", hint="e.g. --input 32 --target 16")
        from layerlab.shapes.table import size_table

        table = size_table(spec.key, nd, channels=_default_channels(spec.name, params),
                           torch_version=torch_version, **params)
        out.json(table) if json else out.show(*render_shapes.size_table(table))
        return 0 if table.ok else 1

    shape = _full_shape(size_arg, spec.name, nd, params)
    if target is not None or undo is not None:
        from layerlab.shapes import inverse

        fixed = {k: v for k, v in params.items() if k not in ("in_channels",)}
        if undo is not None:
            result = inverse.solve_undo(spec.name, shape, _sizes(undo, "--undo", nd), **fixed)
        else:
            result = inverse.solve_target(spec.name, shape, _sizes(target, "--target", nd), **fixed)
        out.json(result) if json else out.show(*render_shapes.inverse(result))
        return 0 if result.ok else 1

    from layerlab.shapes import explain

    ex = explain(spec.key, shape, torch_version=torch_version, **params)
    out.json(ex) if json else out.show(*render_shapes.explanation(ex))
    return 0 if ex.ok else 1


def _default_channels(op: str, params: Dict[str, Any]) -> int:
    """C for a size-only ``--input`` (single op and ``--chain`` alike): ``in_channels`` if given,
    else the smallest C the op accepts — ``groups`` for a grouped conv, r² for pixel_shuffle — else 1."""
    if params.get("in_channels"):
        return int(params["in_channels"])
    if op == "pixel_shuffle" and params.get("upscale_factor"):
        return int(params["upscale_factor"]) ** 2
    if isinstance(params.get("groups"), int) and params["groups"] > 1:
        return int(params["groups"])
    return 1


def _full_shape(size_arg: "parse.SizeArg", op: str, nd: int, params: Dict[str, Any]) -> tuple:
    if size_arg.full:
        return size_arg.dims
    dims = size_arg.dims
    if len(dims) == 1 and nd > 1:
        dims = dims * nd
    if len(dims) != nd:
        raise UsageError(
            f"--input has {len(dims)} spatial sizes but {op} has {nd}",
            where="--input", expected=f"{nd} sizes (or one for all)", got="x".join(map(str, dims)),
            hint=f"e.g. --input {'x'.join(['32'] * nd)}",
        )
    return (1, _default_channels(op, params)) + tuple(dims)


def _sizes(text: str, flag: str, nd: int) -> tuple:
    value = parse.int_tuple(text, flag, minimum=1)
    values = value if isinstance(value, tuple) else (value,)
    if len(values) not in (1, nd):
        raise UsageError(f"{flag} has {len(values)} sizes, expected 1 or {nd}", where=flag, got=text)
    return values


_TUPLE_PARAMS = ("kernel_size", "stride", "padding", "dilation", "output_padding")


def _check_tuple_lengths(params: Dict[str, Any], nd: int, op: str) -> None:
    for name in _TUPLE_PARAMS:
        value = params.get(name)
        if isinstance(value, tuple) and len(value) != nd:
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} has {len(value)} values but {op} has {nd} spatial dims",
                where=flag, expected=f"one value or {nd}", got="x".join(map(str, value)),
                hint=f"e.g. {flag} {'x'.join(['3'] * nd)}",
            )


def _check_positive(params: Dict[str, Any]) -> None:
    for name in ("groups", "in_channels", "out_channels", "upscale_factor", "downscale_factor", "patch_size",
                 "embed_dim", "divisor_override"):
        value = params.get(name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be ≥ 1, got {value}", where=flag, expected="an integer ≥ 1", got=value)


def _run_chain(out, chain: str, input: Optional[str], params: Dict[str, Any],
               torch_version: Optional[str] = None) -> int:
    from layerlab.cli import render_shapes
    from layerlab.shapes.chain import explain_chain, parse_chain

    if input is None:
        raise UsageError("--chain needs --input", where="--chain", hint="e.g. --input 224 --chain 'conv k=7 s=2 p=3'")
    if params:
        raise UsageError(
            "with --chain, give each stage's parameters inside the chain",
            where="--chain", got=", ".join("--" + k.replace("_", "-") for k in params),
            hint="e.g. --chain 'conv k=3 s=2 p=1 | maxpool k=2'",
        )
    stages = parse_chain(chain)
    size_arg = parse.size_arg(input)
    if size_arg.full:
        shape = size_arg.dims
    else:
        # The same rule as a single op: a bare size fills every spatial dim of the FIRST stage's op
        # (conv1d: 1, conv3d: 3, a family name such as conv: 2), C from _default_channels.
        from layerlab.shapes.ops import resolve

        dims = size_arg.dims
        first = resolve(stages[0].op, n_spatial=len(dims) if len(dims) > 1 else None)
        if len(dims) == 1:
            dims = dims * (first.nd or 2)
        shape = (1, _default_channels(first.name, stages[0].params)) + tuple(dims)
    result = explain_chain(shape, stages, torch_version=torch_version)
    out.json(result) if out.json_mode else out.show(*render_shapes.chain(result))
    return 0 if result.ok else 1
