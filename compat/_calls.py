"""Legacy calls the migration command checks, or reshapes rather than renames.

A call the command cannot convert exactly (an argument TF 1's function did
not take, say) is left as it was and reported: `why_not_convertible` says
why. `spec_tuple`, `gpu_devices` and `collective_strategy` build new code
for calls whose shape changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import libcst as cst

from . import _names
from ._syntax import (
    as_keyword,
    bind,
    code_of,
    is_none,
    keyword_arg,
    with_leading_args,
)

# Legacy names whose calls change shape, not just name: the whole call is
# rewritten.
SPECIAL_CALLS = (
    "AllReduceSpecTuple",
    "choose_the_best",
    "MirroredStrategy",
    "CollectiveAllReduceStrategy",
)
# The parameters of TF 1's AllReduceSpecTuple and choose_the_best.
SPEC_PARAMETERS = ("alg", "shards", "limit")
CHOOSE_PARAMETERS = ("devices", "session_config")
# contrib MirroredStrategy's parameters the command converts: positional,
# then keyword-only (TF 1.13's spelling of cross_tower_ops).
STRATEGY_PARAMETERS = (
    ("devices", "num_gpus", "cross_tower_ops"),
    ("cross_device_ops",),
)
# contrib CollectiveAllReduceStrategy's parameters (TF 1.12 took the first
# only).
COLLECTIVE_STRATEGY_PARAMETERS = ("num_gpus_per_worker", "communication")


# A change to report: where (an original node), the old code, the new code,
# and why when the new code does not say it.
Change = tuple[cst.CSTNode, str, str, str]

# Why TF 1's num_gpus_per_worker becomes local_devices.
LOCAL_DEVICES_WHY = (
    "local_devices= is how the strategy takes a worker's devices; TF 1's 0 "
    "meant the CPU, where the strategy's default, like its collective's "
    "num_gpus_per_worker=0, is every GPU"
)


def why_not_convertible(legacy: _names.Legacy, call: cst.Call) -> str | None:
    """Why `call`, a call of `legacy`, cannot be converted; None if it can.

    >>> legacy = _names.LEGACY["NcclAllReduce"]
    >>> why_not_convertible(legacy, cst.parse_expression("f(2, fork=1)"))
    'unknown keyword fork= of NcclAllReduce; TF 1 took num_packs'
    """
    name = legacy.name
    if name == "AllReduceSpecTuple":
        bound, unbound = bind(call, SPEC_PARAMETERS)
        if unbound or len(bound) != 3:
            return (
                "expected AllReduceSpecTuple(alg, shards, limit); "
                f"{legacy.replacement}"
            )
    elif name == "choose_the_best":
        bound, unbound = bind(call, CHOOSE_PARAMETERS)
        if unbound or "devices" not in bound:
            return "expected choose_the_best(devices, session_config=None)"
    elif name == "MirroredStrategy":
        return _strategy_problems(call)
    elif name == "CollectiveAllReduceStrategy":
        if any(arg.star for arg in call.args):
            # Every argument is rewritten to another keyword.
            return (
                "starred arguments: the command cannot tell which hold "
                "num_gpus_per_worker and communication"
            )
        return _constructor_problems(name, COLLECTIVE_STRATEGY_PARAMETERS, call)
    elif name in _names.CONSTRUCTOR_PARAMETERS:
        return _constructor_problems(
            name, _names.CONSTRUCTOR_PARAMETERS[name], call
        )
    return None


def _strategy_problems(call: cst.Call) -> str | None:
    """Why a contrib MirroredStrategy call cannot be converted, or None."""
    bound, unbound = bind(call, *STRATEGY_PARAMETERS)
    problems = []
    for index in unbound:
        arg = call.args[index]
        keyword = arg.keyword.value if arg.keyword else None
        if keyword in _names.STRATEGY_KEYWORDS_BY_HAND:
            why = _names.STRATEGY_KEYWORDS_BY_HAND[keyword]
            problems.append(f"{keyword}=: {why}")
        else:
            problems.append(
                f"{code_of(arg).rstrip(', ')}: not an argument of "
                "MirroredStrategy(devices, num_gpus, cross_tower_ops)"
            )
    if "cross_tower_ops" in bound and "cross_device_ops" in bound:
        problems.append("both cross_tower_ops= and cross_device_ops=")
    given = [
        name
        for name in ("devices", "num_gpus")
        if name in bound and not is_none(call.args[bound[name]].value)
    ]
    if len(given) == 2:
        problems.append("both devices and num_gpus")
    return "; ".join(problems) or None


def _constructor_problems(
    name: str, parameters: tuple[str, ...], call: cst.Call
) -> str | None:
    """Why a call of legacy class `name` cannot be converted, or None.

    An argument TF's class (whose `parameters` these are) did not take would
    fail at run time (a fork's keyword, say). After a `*args` the positions
    are unknown: only the keywords are checked.
    """
    starred = any(arg.star == "*" for arg in call.args)
    problems = []
    positional = 0
    seen: set[str] = set()
    for arg in call.args:
        if arg.star:
            continue
        if arg.keyword is None:
            if not starred and positional < len(parameters):
                seen.add(parameters[positional])
            positional += 1
            continue
        keyword = arg.keyword.value
        if keyword not in parameters:
            problems.append(f"unknown keyword {keyword}= of {name}")
        elif keyword in seen:
            problems.append(f"{keyword}= given twice")
        seen.add(keyword)
    if not starred and positional > len(parameters):
        problems.append(f"{positional} positional arguments to {name}")
    if not problems:
        return None
    took = ", ".join(parameters) if parameters else "no arguments"
    return f"{'; '.join(problems)}; TF 1 took {took}"


def spec_tuple(original: cst.Call, updated: cst.Call) -> cst.Tuple:
    """The plain tuple for `AllReduceSpecTuple(alg, shards, limit)`.

    Args:
        original: the call, as the module has it (its arguments bind).
        updated: the call with its arguments rewritten.
    """
    bound, _ = bind(original, SPEC_PARAMETERS)
    in_order = [bound[param] for param in SPEC_PARAMETERS] == [0, 1, 2]
    elements = []
    for position, param in enumerate(SPEC_PARAMETERS):
        arg = updated.args[bound[param]]
        if in_order:  # Keep the call's layout.
            comma = arg.comma
        elif position < len(SPEC_PARAMETERS) - 1:
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        else:
            comma = cst.MaybeSentinel.DEFAULT
        elements.append(cst.Element(arg.value, comma=comma))
    return cst.Tuple(
        elements,
        lpar=[
            *updated.lpar,
            cst.LeftParen(whitespace_after=updated.whitespace_before_args),
        ],
        rpar=[cst.RightParen(), *updated.rpar],
    )


def gpu_devices(num_gpus: cst.BaseExpression) -> cst.BaseExpression:
    """contrib's strategies' devices for `num_gpus` (0 or None: the CPU).

    >>> code_of(gpu_devices(cst.parse_expression("2")))
    '["/gpu:0", "/gpu:1"]'
    """
    if is_none(num_gpus):
        return cst.parse_expression('["/cpu:0"]')
    if isinstance(num_gpus, cst.Integer):
        count = int(num_gpus.evaluated_value)
        devices = [f"/gpu:{i}" for i in range(count)] or ["/cpu:0"]
        return cst.parse_expression(json.dumps(devices))
    return cst.parse_expression(
        f'[f"/gpu:{{i}}" for i in range({code_of(num_gpus)})] or ["/cpu:0"]'
    )


def collective_strategy(
    original: cst.Call,
    updated: cst.Call,
    spell: Callable[[str], cst.BaseExpression],
) -> tuple[cst.Call, list[Change]]:
    """contrib `CollectiveAllReduceStrategy(num_gpus_per_worker,
    communication)`'s arguments for tf_crossdevice.MultiWorkerMirroredStrategy.

    TF 1's strategy always reduced with CollectiveAllReduce, which
    becomes `cross_device_ops=`; its GPU count (0, its default: the CPU)
    becomes the devices, `local_devices=`; `communication=X` becomes
    `communication_options=CommunicationOptions(implementation=X)`.

    Args:
        original: the call, as the module has it (its arguments bind).
        updated: the call with its callee and arguments rewritten.
        spell: a dotted name (tf.X, tf_crossdevice.X) as code at the call,
            noting the import it needs.

    Returns:
        The new call, and the changes to report.
    """
    bound, _ = bind(original, COLLECTIVE_STRATEGY_PARAMETERS)
    collective = cst.Call(spell("tf_crossdevice.CollectiveAllReduce"))
    leading = [keyword_arg("cross_device_ops", collective)]
    changes: list[Change] = [
        (
            original,
            "(no argument)",
            f"cross_device_ops={code_of(collective)}",
            "the collective TF 1's strategy always used",
        )
    ]
    if "num_gpus_per_worker" not in bound:
        cpu = gpu_devices(cst.Integer("0"))
        leading.append(keyword_arg("local_devices", cpu))
        changes.append(
            (
                original,
                "(default num_gpus_per_worker=0)",
                f"local_devices={code_of(cpu)}",
                LOCAL_DEVICES_WHY,
            )
        )
    parameter = {index: name for name, index in bound.items()}
    args = []
    for index, arg in enumerate(updated.args):
        old = original.args[index]
        if parameter[index] == "num_gpus_per_worker":
            keyword, why = "local_devices", LOCAL_DEVICES_WHY
            value = gpu_devices(arg.value)
        else:
            keyword, why = "communication_options", ""
            options = spell("tf.distribute.experimental.CommunicationOptions")
            value = cst.Call(
                options, [keyword_arg("implementation", arg.value)]
            )
        new = as_keyword(arg, keyword).with_changes(value=value)
        changes.append(
            (
                old,
                f"{parameter[index]}={code_of(old.value)}",
                f"{keyword}={code_of(value)}",
                why,
            )
        )
        args.append(new)
    return with_leading_args(updated, leading, args), changes
