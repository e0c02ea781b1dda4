"""Hostile input for the commands and options of issues 13–15: ``train-check``, ``precision-check``,
``ddp-check``, ``inspect --probe/--steps/--plot/--compare`` and ``diff``.

Unlike :mod:`tests.hostile.corpus` (one spec through every command), each case here is one command
line: ``argv`` is run in the case's own fresh folder, where ``files`` are written first (``str`` as
UTF-8, ``bytes`` as they are, :data:`DIR` for a folder). ``where`` is a piece of text the refusal
must contain: the ``file:line`` of the bad spec value, or the option's name, so the user knows
where to look. ``expect`` is the set of acceptable exit codes (2: refused; 1: the check rightly fails;
0: valid however odd it looks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, Optional, Tuple, Union

DIR = object()  #: a ``files`` value: make a folder of that name


@dataclass(frozen=True)
class Case:
    name: str
    cause: str
    argv: Tuple[str, ...]
    files: Dict[str, Union[str, bytes, object]] = field(default_factory=dict)
    expect: FrozenSet[int] = frozenset({2})
    where: Optional[str] = None
    json_modes: Tuple[bool, ...] = (False, True)  #: run without and with --json

    def expected(self, command: str = "", json_mode: bool = False) -> FrozenSet[int]:  # verdict.problems' API
        return self.expect

    forbid = None


def materialize(case: Case, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is DIR:
            path.mkdir(exist_ok=True)
        else:
            path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)


C = frozenset
MLP = "block:\n  - Linear: {in_features: 3, out_features: 4}\n  - ReLU\n  - Linear: {in_features: 4, out_features: 2}\n"
BASE = MLP + "input: {shape: [4, 3]}\n"          # a tiny model every command runs in well under a second
LINE = "spec.yaml:7"                              # a section's first key is on line 7 of BASE + section


def _section(name: str, body: str) -> Dict[str, str]:
    return {"spec.yaml": BASE + f"{name}:\n{body}"}


def _key(section: str, key: str, value: str) -> Dict[str, str]:
    return _section(section, f"  {key}: {value}\n")


def _train(key: str, value: str, name: str, cause: str = "train-section", where: str = LINE, **kw) -> Case:
    return Case(name, cause, ("train-check", "spec.yaml"), _key("train", key, value), where=where, **kw)


def _precision(key: str, value: str, name: str) -> Case:
    return Case(name, "precision-section", ("precision-check", "spec.yaml"), _key("precision", key, value), where=LINE)


def _ddp(key: str, value: str, name: str) -> Case:
    return Case(name, "ddp-section", ("ddp-check", "spec.yaml"), _key("ddp", key, value), where=LINE)


LOSSES_PY = "import torch\n\ndef my_loss(output, target):\n    open('RAN', 'w').write('x')\n    return output.sum()\n"
TRAIN = [
    _train("steps", "1000000000", "train_steps_1e9", where="spec.yaml:7"),
    _train("steps", "1", "train_steps_1"),
    _train("steps", "-5", "train_steps_negative"),
    _train("steps", "2.5", "train_steps_float"),
    _train("steps", "true", "train_steps_bool"),
    _train("steps", '"50"', "train_steps_string"),
    _train("steps", "[50]", "train_steps_list"),
    _train("steps", "null", "train_steps_null"),
    _train("steps", "100000000000000000000000000", "train_steps_1e26"),
    _train("lr", "-0.1", "train_lr_negative"),
    _train("lr", "0", "train_lr_zero"),
    _train("lr", ".nan", "train_lr_nan"),
    _train("lr", ".inf", "train_lr_inf"),
    _train("lr", "-.inf", "train_lr_minus_inf"),
    _train("lr", '"nan"', "train_lr_nan_string"),
    _train("lr", '"fast"', "train_lr_word"),
    _train("lr", "[0.1]", "train_lr_list"),
    _train("lr", "{a: 1}", "train_lr_mapping"),
    _train("lr", "1e400", "train_lr_overflow_string"),
    _train("lr", "1e-400", "train_lr_underflow_zero"),
    _train("optimizer", "lbfgs", "train_optimizer_unknown"),
    _train("optimizer", "42", "train_optimizer_number"),
    _train("optimizer", "[adam]", "train_optimizer_list"),
    _train("loss", "hinge", "train_loss_unknown"),
    _train("loss", "42", "train_loss_number"),
    _train("loss", '""', "train_loss_empty"),
    _train("loss", "[mse]", "train_loss_list"),
    _train("loss", "./losses.py:my_loss", "train_loss_import_without_allow", cause="import"),
    _train("loss", "os:system", "train_loss_os_system", cause="import"),
    _train("loss", "torch.nn.functional:nope", "train_loss_torch_missing_attr", cause="import"),
    _train("loss", "torch.nn:Linear", "train_loss_torch_module_not_a_loss", cause="import", expect=C({1, 2})),
    _train("output", "5", "train_output_missing_index", cause="train-output", expect=C({1, 2})),
    _train("output", "logits", "train_output_missing_key", cause="train-output", expect=C({1, 2})),
    _train("output", "-1", "train_output_negative", cause="train-output", expect=C({0, 1, 2})),
    _train("output", "1.5", "train_output_float", cause="train-output"),
    _train("output", "[0]", "train_output_list", cause="train-output"),
    _train("output", "true", "train_output_bool", cause="train-output"),
    _train("target", "{shape: [4, 7]}", "train_target_wrong_shape", cause="train-target", expect=C({1, 2})),
    _train("target", "{shape: [4]}", "train_target_wrong_rank", cause="train-target", expect=C({1, 2})),
    _train("target", "{shape: [4, 2], dtype: int64}", "train_target_int_for_mse", cause="train-target",
           expect=C({1, 2})),
    # torch's mse_loss takes 0/1 labels as a bool tensor: a fair target
    _train("target", "{shape: [4, 2], dtype: bool}", "train_target_bool", cause="train-target", expect=C({0, 1, 2})),
    _train("target", "{shape: [4, 2], dtype: complex64}", "train_target_complex", cause="train-target",
           expect=C({1, 2})),
    _train("target", "{shape: [100000000000, 100000000000]}", "train_target_huge", cause="train-target"),
    _train("target", "{shape: [4, -2]}", "train_target_negative_dim", cause="train-target"),
    _train("target", '"zeros"', "train_target_string", cause="train-target"),
    _train("target", "42", "train_target_number", cause="train-target"),
    Case("train_cross_entropy_float_target", "train-target", ("train-check", "spec.yaml"),
         _section("train", "  loss: cross_entropy\n  target: {shape: [4, 2]}\n"), expect=C({0, 1, 2})),
    Case("train_cross_entropy_class_out_of_range", "train-target", ("train-check", "spec.yaml"),
         _section("train", "  loss: cross_entropy\n  target: {shape: [4], low: 0, high: 50}\n"),
         expect=C({1, 2}), where="spec.yaml"),
    Case("train_nll_wrong_rank_target", "train-target", ("train-check", "spec.yaml"),
         _section("train", "  loss: nll\n  target: {shape: [4, 2, 9], low: 0, high: 2}\n"), expect=C({1, 2}),
         where="spec.yaml"),
    Case("train_section_list", "train-section", ("train-check", "spec.yaml"), _section("train", "  - steps\n"),
         where="spec.yaml:6"),
    Case("train_section_scalar", "train-section", ("train-check", "spec.yaml"), {"spec.yaml": BASE + "train: 5\n"},
         where="spec.yaml:6"),
    Case("train_unknown_key", "train-section", ("train-check", "spec.yaml"), _key("train", "stpes", "5"),
         where=LINE),
    Case("train_loss_import_allowed_runs", "import", ("train-check", "spec.yaml", "--allow-import"),
         {**_key("train", "loss", "./losses.py:my_loss"), "losses.py": LOSSES_PY}, expect=C({0, 1})),
    Case("train_cli_steps_1e9", "train-option", ("train-check", "spec.yaml", "--steps", "1000000000"),
         {"spec.yaml": BASE}, where="--steps"),
    Case("train_cli_steps_0", "train-option", ("train-check", "linear", "--steps", "0"), where="--steps"),
    Case("train_cli_steps_word", "train-option", ("train-check", "linear", "--steps", "many"), where="--steps"),
    Case("train_cli_lr_nan", "train-option", ("train-check", "linear", "--lr", "nan"), where="--lr"),
    Case("train_cli_lr_inf", "train-option", ("train-check", "linear", "--lr", "inf"), where="--lr"),
    Case("train_cli_lr_negative", "train-option", ("train-check", "linear", "--lr", "-1"), where="--lr"),
    Case("train_cli_lr_huge_runs", "train-option", ("train-check", "linear", "--lr", "1e30", "--steps", "5"),
         expect=C({1})),
    Case("train_cli_optimizer_unknown", "train-option", ("train-check", "linear", "--optimizer", "rmsprop"),
         where="--optimizer"),
    Case("train_cli_optimizer_empty", "train-option", ("train-check", "linear", "--optimizer", ""),
         where="--optimizer"),
    Case("train_cli_threads_0", "train-option", ("train-check", "linear", "--threads", "0"), where="--threads"),
    Case("train_no_parameters", "train-model", ("train-check", "spec.yaml"),
         {"spec.yaml": "layer: ReLU\ninput: {shape: [4, 3]}\n"}, expect=C({1, 2})),
    Case("train_int_output", "train-model", ("train-check", "spec.yaml"),
         {"spec.yaml": "layer: Embedding\nargs: {num_embeddings: 10, embedding_dim: 3}\n"
                       "input: {shape: [4], dtype: int64, low: 0, high: 10}\ntrain: {loss: nll}\n"},
         expect=C({0, 1, 2})),
    Case("train_meta_device", "train-option", ("train-check", "linear", "--device", "meta"), where="meta"),
]

PRECISION = [
    _precision("autocast", "float64", "precision_autocast_float64"),
    _precision("autocast", "int8", "precision_autocast_int8"),
    _precision("autocast", "[bfloat16, bogus]", "precision_autocast_list_bogus"),
    _precision("autocast", "{a: 1}", "precision_autocast_mapping"),
    _precision("autocast", "42", "precision_autocast_number"),
    _precision("autocast", "[[bfloat16]]", "precision_autocast_nested"),
    _precision("cast", "float8", "precision_cast_float8"),
    _precision("cast", "true", "precision_cast_bool"),
    _precision("grad_scaler", '"yes"', "precision_grad_scaler_string"),
    _precision("grad_scaler", "1", "precision_grad_scaler_int"),
    _precision("tolerance_scale", "0", "precision_tolerance_zero"),
    _precision("tolerance_scale", "-2", "precision_tolerance_negative"),
    _precision("tolerance_scale", ".nan", "precision_tolerance_nan"),
    _precision("tolerance_scale", ".inf", "precision_tolerance_inf"),
    _precision("tolerance_scale", '"2"', "precision_tolerance_string"),
    _precision("tolerence_scale", "2", "precision_unknown_key"),
    Case("precision_section_list", "precision-section", ("precision-check", "spec.yaml"),
         _section("precision", "  - bfloat16\n"), where="spec.yaml:6"),
    Case("precision_autocast_empty_list", "precision-section", ("precision-check", "spec.yaml"),
         _key("precision", "autocast", "[]"), expect=C({0, 2})),
    Case("precision_cli_autocast_bogus", "precision-option", ("precision-check", "linear", "--autocast", "fp8"),
         where="--autocast"),
    Case("precision_cli_autocast_empty", "precision-option", ("precision-check", "linear", "--autocast", ""),
         where="--autocast"),
    Case("precision_cli_autocast_commas", "precision-option", ("precision-check", "linear", "--autocast", ",,"),
         where="--autocast"),
    Case("precision_cli_autocast_float32", "precision-option", ("precision-check", "linear", "--autocast", "float32"),
         where="--autocast"),
    Case("precision_cli_autocast_none_and_dtype", "precision-option",
         ("precision-check", "linear", "--autocast", "none,bfloat16"), where="--autocast"),
    Case("precision_cli_autocast_escape", "precision-option",
         ("precision-check", "linear", "--autocast", "\x1b[31mred"), where="--autocast"),
    Case("precision_cli_cast_int64", "precision-option", ("precision-check", "linear", "--cast", "int64"),
         where="--cast"),
    Case("precision_cli_cast_none", "precision-option", ("precision-check", "linear", "--cast", "none"),
         expect=C({0, 2})),
    Case("precision_cli_tolerance_zero", "precision-option",
         ("precision-check", "linear", "--tolerance-scale", "0"), where="--tolerance-scale"),
    Case("precision_cli_tolerance_nan", "precision-option",
         ("precision-check", "linear", "--tolerance-scale", "nan"), where="--tolerance-scale"),
    Case("precision_cli_tolerance_inf", "precision-option",
         ("precision-check", "linear", "--tolerance-scale", "inf"), where="--tolerance-scale"),
    Case("precision_cli_tolerance_negative", "precision-option",
         ("precision-check", "linear", "--tolerance-scale", "-1"), where="--tolerance-scale"),
    Case("precision_cli_tolerance_word", "precision-option",
         ("precision-check", "linear", "--tolerance-scale", "big"), where="--tolerance-scale"),
    Case("precision_cli_tolerance_tiny_runs", "precision-option",
         ("precision-check", "linear", "--tolerance-scale", "1e-300"), expect=C({0, 1})),
    Case("precision_cli_depth_negative", "precision-option", ("precision-check", "linear", "--depth", "-1"),
         where="--depth"),
    Case("precision_int_input", "precision-model", ("precision-check", "spec.yaml"),
         {"spec.yaml": "layer: Embedding\nargs: {num_embeddings: 10, embedding_dim: 3}\n"
                       "input: {shape: [4], dtype: int64, low: 0, high: 10}\n"}, expect=C({0, 1})),
]

DDP = [
    _ddp("nproc", "0", "ddp_nproc_zero"),
    _ddp("nproc", "100000", "ddp_nproc_huge"),
    _ddp("nproc", '"2"', "ddp_nproc_string"),
    _ddp("nproc", "2.0", "ddp_nproc_float"),
    _ddp("nproc", "true", "ddp_nproc_bool"),
    _ddp("timeout", "0", "ddp_timeout_zero"),
    _ddp("timeout", "-5", "ddp_timeout_negative"),
    _ddp("timeout", ".nan", "ddp_timeout_nan"),
    _ddp("timeout", ".inf", "ddp_timeout_inf"),
    _ddp("timeout", "1e300", "ddp_timeout_1e300"),
    _ddp("timeout", '"60"', "ddp_timeout_string"),
    _ddp("find_unused_parameters", '"no"', "ddp_find_unused_string"),
    _ddp("broadcast_buffers", "0", "ddp_broadcast_int"),
    _ddp("loss", "mse", "ddp_loss_not_a_path"),
    _ddp("loss", "42", "ddp_loss_number"),
    _ddp("loss", "./losses.py:my_loss", "ddp_loss_import_without_allow"),
    _ddp("nprocs", "2", "ddp_unknown_key"),
    Case("ddp_section_list", "ddp-section", ("ddp-check", "spec.yaml"), _section("ddp", "  - 2\n"),
         where="spec.yaml:6"),
    Case("ddp_cli_nproc_0", "ddp-option", ("ddp-check", "linear", "--nproc", "0"), where="--nproc"),
    Case("ddp_cli_nproc_negative", "ddp-option", ("ddp-check", "linear", "--nproc", "-3"), where="--nproc"),
    Case("ddp_cli_nproc_huge", "ddp-option", ("ddp-check", "linear", "--nproc", "1000000"), where="--nproc"),
    Case("ddp_cli_nproc_2_63", "ddp-option", ("ddp-check", "linear", "--nproc", str(2**63)), where="--nproc"),
    Case("ddp_cli_nproc_word", "ddp-option", ("ddp-check", "linear", "--nproc", "two"), where="--nproc"),
    Case("ddp_cli_timeout_0", "ddp-option", ("ddp-check", "linear", "--timeout", "0"), where="--timeout"),
    Case("ddp_cli_timeout_negative", "ddp-option", ("ddp-check", "linear", "--timeout", "-1"), where="--timeout"),
    Case("ddp_cli_timeout_huge", "ddp-option", ("ddp-check", "linear", "--timeout", "1e300"), where="--timeout"),
    Case("ddp_cli_timeout_nan", "ddp-option", ("ddp-check", "linear", "--timeout", "nan"), where="--timeout"),
    Case("ddp_cli_timeout_inf", "ddp-option", ("ddp-check", "linear", "--timeout", "inf"), where="--timeout"),
    Case("ddp_batch_cannot_split", "ddp-batch", ("ddp-check", "spec.yaml", "--nproc", "3"), {"spec.yaml": BASE},
         where="--nproc"),
    Case("ddp_batch_smaller_than_world", "ddp-batch", ("ddp-check", "spec.yaml", "--nproc", "8"),
         {"spec.yaml": BASE}, where="--nproc"),
    Case("ddp_no_batch", "ddp-batch", ("ddp-check", "spec.yaml"),
         {"spec.yaml": "layer: Linear\nargs: {in_features: 3, out_features: 2}\ninput: {shape: [3]}\n"},
         where="input"),
    Case("ddp_meta_device", "ddp-option", ("ddp-check", "linear", "--device", "meta"), where="meta"),
]



def all_cases() -> Tuple[Case, ...]:
    """Every case (names unique): these, then inspect's and diff's (:mod:`tests.hostile.corpus_new_inspect_diff`)."""
    from tests.hostile.corpus_new_inspect_diff import DIFF, PROBES, STEPS_PLOT

    cases = tuple(TRAIN + PRECISION + DDP + PROBES + STEPS_PLOT + DIFF)
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), {n for n in names if names.count(n) > 1}
    return cases
