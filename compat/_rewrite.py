"""The migration command's rewriting: legacy cross-device code to TF 2.21.

A libcst transformer works on the concrete syntax tree, so comments and
formatting survive. Names are resolved through the module's imports
(libcst's QualifiedNameProvider), so `distribute.X` is a legacy name only
where `distribute` was imported from a legacy module. What to rewrite, and
why a name cannot be, comes from `_names`. Pure libcst: no TensorFlow import,
so the command starts fast.

>>> print(rewrite("from tf_crossdevice import compat\\n"
...               "ops = compat.AllReduceCrossTowerOps('nccl')\\n").code)
import tf_crossdevice
ops = tf_crossdevice.AllReduceCrossDeviceOps('nccl')
<BLANKLINE>
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import re
from collections.abc import Iterator, Sequence

import libcst as cst
from libcst import helpers, metadata

from . import _names

# A LEGACY replacement that is code: a dotted name the command can write.
_DOTTED = re.compile(r"(tf|tf_crossdevice)(\.\w+)+")
# Legacy names whose calls change shape, not just name (see _Upgrader).
_SPECIAL_CALLS = ("AllReduceSpecTuple", "choose_the_best", "MirroredStrategy")
# Keywords that hold the reduce op in REDUCE_METHODS calls.
_REDUCE_OP_KEYWORDS = ("aggregation", "method_string", "reduce_op")
# Import statements the rewritten code may need, by the name it binds and the
# module bound to it; written in this order after the last top-level import.
_IMPORTS = {
    "import tensorflow as tf": ("tf", "tensorflow"),
    "import tensorflow": ("tensorflow", "tensorflow"),
    "import tf_crossdevice": ("tf_crossdevice", "tf_crossdevice"),
    "import tf_crossdevice.compat": (
        "tf_crossdevice.compat",
        "tf_crossdevice.compat",
    ),
}
_REPORT_WIDTH = 80
# Code without any of these has nothing to rewrite or report, and skips the
# name resolution (most of the time spent on a module): every legacy source
# is spelled with one, and so is every keyword and reduce op rewritten.
_CLUES = re.compile(
    "|".join(
        [
            "compat",
            "contrib",
            "VariableAggregation",
            "estimator",
            *(
                name.rpartition(".")[2]
                for name in _names.TF_LEGACY_NAMES
                if ".compat." not in name  # Those are spelled with compat.
            ),
            *_names.KEYWORDS,
        ]
    )
)


class Kind(enum.Enum):
    """What a report line says about a piece of code."""

    CHANGED = "changed"
    NOT_CONVERTED = "not converted"
    CANNOT_PARSE = "cannot parse"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One report line: a change, or something left for a person.

    Attributes:
        line: the line in the original file.
        kind: what happened.
        message: "OLD -> NEW" for a change, "WHAT (WHY)" otherwise.
    """

    line: int
    kind: Kind
    message: str

    def report_line(self, path: str) -> str:
        """`PATH:LINE: changed OLD -> NEW` or `PATH:LINE: KIND: MESSAGE`.

        >>> Finding(3, Kind.CHANGED, "a -> b").report_line("x.py")
        'x.py:3: changed a -> b'
        >>> Finding(4, Kind.NOT_CONVERTED, "f (why)").report_line("x.py")
        'x.py:4: not converted: f (why)'
        """
        separator = " " if self.kind is Kind.CHANGED else ": "
        return f"{path}:{self.line}: {self.kind.value}{separator}{self.message}"


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """The rewritten code of one module and its report, in line order."""

    code: str
    findings: tuple[Finding, ...]

    def count(self, kind: Kind) -> int:
        return sum(finding.kind is kind for finding in self.findings)


class ParseError(ValueError):
    """The code is not Python that libcst can parse."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


def rewrite(code: str) -> Rewrite:
    """Rewrites legacy cross-device names in `code` (a module's source).

    Raises:
        ParseError: `code` does not parse.
    """
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError as error:
        # Python's own message and line are the ones a reader knows.
        try:
            ast.parse(code)
        except SyntaxError as python_error:
            line = python_error.lineno or error.raw_line
            raise ParseError(line, python_error.msg) from error
        raise ParseError(error.raw_line, error.message) from error
    if not _CLUES.search(code):
        return Rewrite(code, ())
    wrapper = metadata.MetadataWrapper(module)
    upgrader = _Upgrader()
    new_code = wrapper.visit(upgrader).code
    findings = sorted(upgrader.findings, key=lambda item: item[0])
    return Rewrite(new_code, tuple(finding for _, finding in findings))


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _one_line(code: str) -> str:
    """Code for a report line: one line, at most _REPORT_WIDTH characters."""
    text = " ".join(code.split())
    text = re.sub(r"([(\[{]) ", r"\1", text)
    text = re.sub(r",? ([)\]}])", r"\1", text)
    if len(text) > _REPORT_WIDTH:
        text = text[: _REPORT_WIDTH - 3] + "..."
    return text


def _chain(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`a.b.c`, `a.b`, `a`: the node and the attribute chain inside it."""
    while isinstance(node, cst.Attribute):
        yield node
        node = node.value
    yield node


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _bind(
    call: cst.Call, positional: Sequence[str], keyword_only: Sequence[str] = ()
) -> tuple[dict[str, int], list[int]]:
    """Parameter name -> argument index, and the indexes that bind to none.

    An argument binds to none when it is starred, an extra positional one,
    an unknown keyword, or a second value for a parameter.
    """
    bound: dict[str, int] = {}
    unbound: list[int] = []
    for index, arg in enumerate(call.args):
        if arg.star:
            unbound.append(index)
            continue
        if arg.keyword is None:
            name = positional[index] if index < len(positional) else None
        else:
            name = arg.keyword.value
        known = (*positional, *keyword_only)
        if name is None or name not in known or name in bound:
            unbound.append(index)
        else:
            bound[name] = index
    return bound, unbound


def _with_args(call: cst.Call, args: Sequence[cst.Arg]) -> cst.Call:
    """`call` with `args`, the last one ending as the call's last did."""
    args = list(args)
    if args and call.args:
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)


def _as_keyword(arg: cst.Arg, keyword: str) -> cst.Arg:
    if arg.keyword is not None:
        return arg.with_changes(keyword=cst.Name(keyword))
    return arg.with_changes(
        keyword=cst.Name(keyword),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=cst.SimpleWhitespace(""),
        ),
    )


def _gpu_devices(num_gpus: cst.BaseExpression) -> cst.BaseExpression:
    """contrib MirroredStrategy's devices for `num_gpus` (0: the CPU)."""
    if isinstance(num_gpus, cst.Integer):
        count = int(num_gpus.evaluated_value)
        devices = [f"/gpu:{i}" for i in range(count)] or ["/cpu:0"]
        return cst.parse_expression(json.dumps(devices))
    return cst.parse_expression(
        f'[f"/gpu:{{i}}" for i in range({_code(num_gpus)})] or ["/cpu:0"]'
    )


# contrib MirroredStrategy's parameters the command converts: positional,
# then keyword-only (TF 1.13's spelling of cross_tower_ops).
_STRATEGY_PARAMETERS = (
    ("devices", "num_gpus", "cross_tower_ops"),
    ("cross_device_ops",),
)


def _strategy_problems(call: cst.Call) -> str | None:
    """Why a contrib MirroredStrategy call cannot be converted, or None."""
    bound, unbound = _bind(call, *_STRATEGY_PARAMETERS)
    problems = []
    for index in unbound:
        arg = call.args[index]
        keyword = arg.keyword.value if arg.keyword else None
        if keyword in _names.STRATEGY_KEYWORDS_BY_HAND:
            why = _names.STRATEGY_KEYWORDS_BY_HAND[keyword]
            problems.append(f"{keyword}=: {why}")
        else:
            problems.append(
                f"{_code(arg).rstrip(', ')}: not an argument of "
                "MirroredStrategy(devices, num_gpus, cross_tower_ops)"
            )
    if "cross_tower_ops" in bound and "cross_device_ops" in bound:
        problems.append("both cross_tower_ops= and cross_device_ops=")
    given = [
        name
        for name in ("devices", "num_gpus")
        if name in bound and not _is_none(call.args[bound[name]].value)
    ]
    if len(given) == 2:
        problems.append("both devices and num_gpus")
    return "; ".join(problems) or None


def _constructor_problems(name: str, call: cst.Call) -> str | None:
    """Why a call of legacy class `name` cannot be renamed, or None.

    An argument TF's class did not take would fail at run time (a fork's
    keyword, say). After a `*args` the positions are unknown: only the
    keywords are checked.
    """
    parameters = _names.CONSTRUCTOR_PARAMETERS[name]
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


@dataclasses.dataclass(frozen=True)
class _Match:
    """A use of a legacy name, and where it was imported from."""

    legacy: _names.Legacy
    source: str  # "contrib", "compat" or "tensorflow".


@dataclasses.dataclass
class _Import:
    """An import statement, as the original module has it."""

    node: cst.Import | cst.ImportFrom
    scope: metadata.Scope | None
    line: int


class _Upgrader(cst.CSTTransformer):
    """Rewrites uses, then drops legacy imports left unused, adds new ones.

    Import statements are not visited, so they keep their identity in the
    new tree; leave_Module finds them there to prune them.
    """

    METADATA_DEPENDENCIES = (
        metadata.ParentNodeProvider,
        metadata.PositionProvider,
        metadata.QualifiedNameProvider,
        metadata.ScopeProvider,
    )

    def __init__(self) -> None:
        super().__init__()
        self.findings: list[tuple[tuple[int, int, int], Finding]] = []
        self._matched: set[cst.CSTNode] = set()
        # Original name accesses the new code no longer holds.
        self._consumed: set[cst.CSTNode] = set()
        self._imports: list[_Import] = []
        # Calls left exactly as they were (see visit_Call).
        self._untouched: set[cst.Call] = set()
        # Import statements the new code needs -> (name, module) they bind.
        self._needs: dict[str, tuple[str, str]] = {}

    # Reports.

    def _report(self, node: cst.CSTNode, kind: Kind, message: str) -> None:
        start = self.get_metadata(metadata.PositionProvider, node).start
        key = (start.line, start.column, len(self.findings))
        self.findings.append((key, Finding(start.line, kind, message)))

    def _changed(self, node: cst.CSTNode, old: str, new: str) -> None:
        self._report(
            node, Kind.CHANGED, f"{_one_line(old)} -> {_one_line(new)}"
        )

    def _not_converted(self, node: cst.CSTNode, what: str, why: str) -> None:
        self._report(node, Kind.NOT_CONVERTED, f"{_one_line(what)} ({why})")

    # Names.

    def _is_access(self, name: cst.Name) -> bool:
        scope = self.get_metadata(metadata.ScopeProvider, name, None)
        return scope is not None and any(
            access.node is name for access in scope.accesses[name.value]
        )

    def _qualified_name(self, node: cst.CSTNode) -> str | None:
        """The dotted name `node` refers to, through the module's imports.

        A `tf` the module never binds (a snippet) is taken as TensorFlow.
        """
        names = {
            name.name
            for name in self.get_metadata(
                metadata.QualifiedNameProvider, node, set()
            )
        }
        if len(names) == 1:
            return names.pop()
        if names or not isinstance(node, (cst.Name, cst.Attribute)):
            return None
        *_, root = _chain(node)
        if not (isinstance(root, cst.Name) and root.value == "tf"):
            return None
        scope = self.get_metadata(metadata.ScopeProvider, root, None)
        if scope is None or "tf" in scope or not self._is_access(root):
            return None
        full = helpers.get_full_name_for_node(node)
        return None if full is None else "tensorflow" + full[len("tf") :]

    def _match(self, node: cst.CSTNode) -> _Match | None:
        name = self._qualified_name(node)
        if name is None:
            return None
        if name in _names.TF_LEGACY_NAMES:
            if name.startswith("tensorflow.compat.v1."):
                # Under `import tensorflow.compat.v1 as tf`, tf.distribute.X
                # is TF 1 code's own spelling, and the same object.
                *_, root = _chain(node)
                if self._qualified_name(root) == "tensorflow.compat.v1":
                    return None
            legacy = _names.LEGACY[_names.TF_LEGACY_NAMES[name]]
            return _Match(legacy, "tensorflow")
        module, _, attribute = name.rpartition(".")
        if module in _names.LEGACY_MODULES and attribute in _names.LEGACY:
            source = (
                "compat" if module == "tf_crossdevice.compat" else "contrib"
            )
            return _Match(_names.LEGACY[attribute], source)
        return None

    def _expression(self, dotted: str, site: cst.CSTNode) -> cst.BaseExpression:
        """`dotted` (tf.X or tf_crossdevice.X) as code at `site`.

        Notes the import it needs unless `site` sees that name already.
        Where an import binds `tf` to another module (`import
        tensorflow.compat.v1 as tf`), TensorFlow's names are spelled
        `tensorflow.`.
        """
        scope = self.get_metadata(metadata.ScopeProvider, site, None)
        if dotted.startswith("tf."):
            if self._imported_as(scope, "tf") - {"tensorflow", ""}:
                dotted = "tensorflow." + dotted[len("tf.") :]
                statement = "import tensorflow"
            else:
                statement = "import tensorflow as tf"
        elif dotted.startswith("tf_crossdevice.compat."):
            statement = "import tf_crossdevice.compat"
        else:
            statement = "import tf_crossdevice"
        name, module = _IMPORTS[statement]
        if not self._imported_as(scope, name) & {module, ""}:
            self._needs[statement] = (name, module)
        return cst.parse_expression(dotted)

    def _imported_as(self, scope: metadata.Scope | None, name: str) -> set[str]:
        """The modules `name` is imported as in `scope`; "" for a binding
        that is not an import (`tf = self.tf`, taken to be the usual
        module). Legacy imports do not count: the command may drop them."""
        if scope is None:
            return set()
        bound: set[str] = set()
        for assignment in scope[name]:
            node = getattr(assignment, "node", None)
            if not isinstance(node, (cst.Import, cst.ImportFrom)):
                bound.add("")
            elif not any(
                _is_legacy_target(target)
                for _, target, _ in _import_targets(node)
            ):
                names = assignment.get_qualified_names_for(name)
                bound.update(qualified.name for qualified in names)
        return bound

    def _replace(
        self,
        original: cst.BaseExpression,
        updated: cst.BaseExpression,
        new: cst.BaseExpression,
    ) -> cst.BaseExpression:
        """`new` in place of `original`, keeping its parentheses."""
        self._consumed.update(_chain(original))
        self._changed(original, _code(original), _code(new))
        return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _is_call_func(self, node: cst.CSTNode) -> bool:
        parent = self.get_metadata(metadata.ParentNodeProvider, node, None)
        return isinstance(parent, cst.Call) and parent.func is node

    def visit_Import(self, node: cst.Import) -> bool:
        self._record_import(node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        self._record_import(node)
        return False

    def _record_import(self, node: cst.Import | cst.ImportFrom) -> None:
        scope = self.get_metadata(metadata.ScopeProvider, node, None)
        line = self.get_metadata(metadata.PositionProvider, node).start.line
        self._imports.append(_Import(node, scope, line))
        if isinstance(node, cst.ImportFrom) and isinstance(
            node.names, cst.ImportStar
        ):
            module = helpers.get_full_name_for_node(node.module or node)
            if not node.relative and module and _is_legacy_target(module):
                # Its names cannot be told from the module's own.
                self._not_converted(
                    node,
                    _code(node),
                    "import the names it uses by name, then upgrade again",
                )

    def leave_Name(
        self, original_node: cst.Name, updated_node: cst.Name
    ) -> cst.BaseExpression:
        return self._leave_reference(original_node, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return self._leave_reference(original_node, updated_node)

    def _leave_reference(
        self,
        original: cst.Name | cst.Attribute,
        updated: cst.Name | cst.Attribute,
    ) -> cst.BaseExpression:
        match = self._match(original)
        if match is None:
            self._report_contrib(original)
            self._report_removed(original)
            return updated
        self._matched.add(original)
        if match.legacy.name in _SPECIAL_CALLS and self._is_call_func(original):
            return updated  # leave_Call rewrites the whole call.
        return self._rename(original, updated, match)

    def _rename(
        self,
        original: cst.BaseExpression,
        updated: cst.BaseExpression,
        match: _Match,
    ) -> cst.BaseExpression:
        legacy = match.legacy
        if legacy.rename and _DOTTED.fullmatch(legacy.replacement):
            new = self._expression(legacy.replacement, original)
            return self._replace(original, updated, new)
        # Left to a person; contrib's path becomes the compat layer's, which
        # runs on TF 2.21.
        if match.source == "contrib":
            new = self._expression(
                f"tf_crossdevice.compat.{legacy.name}", original
            )
            updated = self._replace(original, updated, new)
        self._not_converted(original, _code(updated), legacy.replacement)
        return updated

    def _report_contrib(self, node: cst.Name | cst.Attribute) -> None:
        """Reports the outermost tf.contrib reference of a chain."""
        parent = self.get_metadata(metadata.ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return
        name = self._qualified_name(node)
        if name is None or not (
            name == "tensorflow.contrib"
            or name.startswith("tensorflow.contrib.")
        ):
            return
        if any(inner in self._matched for inner in _chain(node)):
            return
        tf_name = "tf" + name[len("tensorflow") :]
        self._not_converted(
            node, tf_name, "not a cross-device name; see tf_upgrade_v2"
        )

    def _report_removed(self, node: cst.Name | cst.Attribute) -> None:
        """Reports the outermost use of a module TensorFlow 2.21 lacks: the
        whole call where the use is called, once for nested calls."""
        parent = self.get_metadata(metadata.ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return
        why = self._removed(node)
        if why is None:
            return
        what: cst.CSTNode = node
        if isinstance(parent, cst.Call) and parent.func is node:
            what = parent
        ancestor = self.get_metadata(metadata.ParentNodeProvider, what, None)
        while ancestor is not None:
            if isinstance(ancestor, cst.Call) and self._removed(ancestor.func):
                return  # Reported with the call that holds it.
            ancestor = self.get_metadata(
                metadata.ParentNodeProvider, ancestor, None
            )
        self._not_converted(node, _code(what), why)

    def _removed(self, node: cst.CSTNode) -> str | None:
        """Why the module `node` is in is gone, or None."""
        name = self._qualified_name(node) or ""
        for module, why in _names.REMOVED_MODULES.items():
            if name == module or name.startswith(module + "."):
                return why
        return None

    # Calls.

    def visit_Call(self, node: cst.Call) -> bool:
        """Leaves a call the command cannot convert exactly as it was.

        Its arguments are not visited either: no half-converted call.
        """
        why = self._why_not_convertible(node)
        if why is None:
            return True
        self._not_converted(node, _code(node), why)
        self._untouched.add(node)
        return False

    def _why_not_convertible(self, call: cst.Call) -> str | None:
        match = self._match(call.func)
        if match is None:
            return None
        name = match.legacy.name
        if name == "AllReduceSpecTuple":
            bound, unbound = _bind(call, ("alg", "shards", "limit"))
            if unbound or len(bound) != 3:
                return (
                    "expected AllReduceSpecTuple(alg, shards, limit); "
                    f"{match.legacy.replacement}"
                )
        elif name == "choose_the_best":
            bound, unbound = _bind(call, ("devices", "session_config"))
            if unbound or "devices" not in bound:
                return "expected choose_the_best(devices, session_config=None)"
        elif name == "MirroredStrategy":
            return _strategy_problems(call)
        elif name in _names.CONSTRUCTOR_PARAMETERS:
            return _constructor_problems(name, call)
        return None

    def leave_Call(
        self, original_node: cst.Call, updated_node: cst.Call
    ) -> cst.BaseExpression:
        if original_node in self._untouched:
            return updated_node
        match = self._match(original_node.func)
        if match is not None and match.legacy.name in _SPECIAL_CALLS:
            if match.legacy.name == "AllReduceSpecTuple":
                return self._spec_tuple(original_node, updated_node, match)
            if match.legacy.name == "choose_the_best":
                return self._choose_the_best(original_node, updated_node, match)
            return self._mirrored_strategy(original_node, updated_node, match)
        func = updated_node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in _names.KEYWORD_METHODS
        ):
            return self._method_call(original_node, updated_node)
        return updated_node

    def _spec_tuple(
        self, original: cst.Call, updated: cst.Call, match: _Match
    ) -> cst.BaseExpression:
        params = ("alg", "shards", "limit")
        bound, _ = _bind(original, params)
        in_order = [bound[param] for param in params] == [0, 1, 2]
        elements = []
        for position, param in enumerate(params):
            arg = updated.args[bound[param]]
            if in_order:  # Keep the call's layout.
                comma = arg.comma
            elif position < len(params) - 1:
                comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            else:
                comma = cst.MaybeSentinel.DEFAULT
            elements.append(cst.Element(arg.value, comma=comma))
        new = cst.Tuple(
            elements,
            lpar=[
                *updated.lpar,
                cst.LeftParen(whitespace_after=updated.whitespace_before_args),
            ],
            rpar=[cst.RightParen(), *updated.rpar],
        )
        self._consumed.update(_chain(original.func))
        self._changed(original, _code(original), _code(new))
        return new

    def _choose_the_best(
        self, original: cst.Call, updated: cst.Call, match: _Match
    ) -> cst.BaseExpression:
        bound, _ = _bind(original, ("devices", "session_config"))
        replacement = match.legacy.replacement
        new_func = self._replace(
            original.func,
            updated.func,
            self._expression(replacement, original),
        )
        if "session_config" in bound:
            index = bound["session_config"]
            config = original.args[index].value
            if not _is_none(config):
                self._not_converted(
                    original.args[index],
                    f"session_config={_code(config)}",
                    match.legacy.change,
                )
        devices = updated.args[bound["devices"]]
        return _with_args(updated.with_changes(func=new_func), [devices])

    def _mirrored_strategy(
        self, original: cst.Call, updated: cst.Call, match: _Match
    ) -> cst.BaseExpression:
        bound, _ = _bind(original, *_STRATEGY_PARAMETERS)
        num_gpus = bound.get("num_gpus")
        from_num_gpus = num_gpus is not None and not _is_none(
            original.args[num_gpus].value
        )
        new_func = self._replace(
            original.func,
            updated.func,
            self._expression(match.legacy.replacement, original),
        )
        parameter = {index: name for name, index in bound.items()}
        args = []
        for index, arg in enumerate(updated.args):
            name = parameter[index]
            old = original.args[index]
            if name == "devices" and from_num_gpus:
                continue  # devices=None: num_gpus gives the devices.
            if name == "num_gpus":
                if not from_num_gpus:
                    continue
                new = _as_keyword(arg, "devices").with_changes(
                    value=_gpu_devices(arg.value)
                )
                self._changed(
                    old,
                    f"num_gpus={_code(old.value)}",
                    f"devices={_code(new.value)}",
                )
                arg = new
            elif name == "cross_tower_ops":
                keyword = _names.KEYWORDS["cross_tower_ops"]
                arg = _as_keyword(arg, keyword)
                self._changed(old, "cross_tower_ops=", f"{keyword}=")
            args.append(arg)
        return _with_args(updated.with_changes(func=new_func), args)

    def _method_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """Keywords (KEYWORDS) and a VariableAggregation reduce op."""
        args = list(updated.args)
        keywords = {arg.keyword.value for arg in original.args if arg.keyword}
        for index, (old, arg) in enumerate(
            zip(original.args, args, strict=True)
        ):
            if arg.keyword is None or arg.keyword.value not in _names.KEYWORDS:
                continue
            keyword = arg.keyword.value
            new_keyword = _names.KEYWORDS[keyword]
            if new_keyword in keywords:
                self._not_converted(
                    old, f"{keyword}=", f"{new_keyword}= is passed too"
                )
                continue
            keywords.add(new_keyword)
            args[index] = arg.with_changes(keyword=cst.Name(new_keyword))
            self._changed(old, f"{keyword}=", f"{new_keyword}=")
        func = updated.func
        assert isinstance(func, cst.Attribute)
        if func.attr.value in _names.REDUCE_METHODS:
            for index, old in enumerate(original.args):
                first = index == 0 and old.keyword is None and not old.star
                by_keyword = (
                    old.keyword is not None
                    and old.keyword.value in _REDUCE_OP_KEYWORDS
                )
                if first or by_keyword:
                    value = self._reduce_op(old.value)
                    if value is not None:
                        args[index] = args[index].with_changes(value=value)
        return updated.with_changes(args=args)

    def _reduce_op(self, node: cst.BaseExpression) -> cst.BaseExpression | None:
        """The ReduceOp for a VariableAggregation member.

        The strings "sum" and "mean" stay: TensorFlow 2 takes them too.
        """
        member = None
        if isinstance(node, cst.Attribute):
            name = self._qualified_name(node) or ""
            enum_name, _, attribute = name.rpartition(".")
            if enum_name in _names.VARIABLE_AGGREGATION_ENUMS:
                member = attribute
        if member in _names.AGGREGATIONS:
            new = self._expression(_names.AGGREGATIONS[member], node)
            self._changed(node, _code(node), _code(new))
            return new.with_changes(lpar=node.lpar, rpar=node.rpar)
        if member in _names.NOT_REDUCTIONS:
            self._not_converted(
                node, _code(node), _names.NOT_REDUCTIONS[member]
            )
        return None

    # Imports.

    def leave_Module(
        self, original_node: cst.Module, updated_node: cst.Module
    ) -> cst.Module:
        removed: set[cst.ImportAlias] = set()
        for record in self._imports:
            aliases = self._unused_legacy_aliases(record)
            removed.update(aliases)
            if aliases:
                kept = _prune_import(record.node, removed)
                self._report(
                    record.node,
                    Kind.CHANGED,
                    f"{_one_line(_code(record.node))} -> "
                    + (
                        "(removed, no uses left)"
                        if kept is None
                        else _one_line(_code(kept))
                    ),
                )
        bound = self._module_bindings(removed)
        missing = [
            statement
            for statement, binding in self._needs.items()
            if binding not in bound
        ]
        if "import tf_crossdevice.compat" in missing:
            # It binds tf_crossdevice too.
            missing = [s for s in missing if s != "import tf_crossdevice"]
        order = list(_IMPORTS)
        missing.sort(key=lambda s: (order.index(s) if s in order else 99, s))
        new_imports = [cst.parse_statement(statement) for statement in missing]
        insert_at = _insertion_index(original_node)
        line = 1
        if insert_at > 0:
            anchor = original_node.body[insert_at - 1]
            line = self.get_metadata(metadata.PositionProvider, anchor).end.line
        for statement in missing:
            finding = Finding(line, Kind.CHANGED, f"(no import) -> {statement}")
            self.findings.append(((line, 0, len(self.findings)), finding))
        if not removed and not new_imports:
            return updated_node
        module = updated_node.visit(_ImportPruner(removed))
        assert isinstance(module, cst.Module)
        body, carried = _prune_body(
            module.body, removed, insert_at, new_imports
        )
        footer = [*carried, *module.footer]
        return module.with_changes(body=body, footer=footer)

    def _unused_legacy_aliases(self, record: _Import) -> list[cst.ImportAlias]:
        """The aliases of a legacy import whose every use was rewritten."""
        unused = []
        for alias, target, bound_names in _import_targets(record.node):
            if not _is_legacy_target(target) or record.scope is None:
                continue
            # The alias's own name, then (for `import a.b.c`) the shorter
            # names it binds: a.b must be unused, `a` may be re-imported.
            if (bound_names[0], target) in self._needs.values():
                continue  # The new code uses it too.
            *inner, root = bound_names
            uses_left = self._uses_left(record, bound_names[0])
            for name in inner[1:]:
                uses_left |= self._uses_left(record, name)
            if root != bound_names[0] and self._uses_left(record, root):
                self._needs[f"import {root}"] = (root, root)
            if not uses_left:
                unused.append(alias)
        return unused

    def _uses_left(self, record: _Import, name: str) -> bool:
        assert record.scope is not None
        for assignment in record.scope.assignments[name]:
            if getattr(assignment, "node", None) is record.node:
                return any(
                    access.node not in self._consumed
                    for access in assignment.references
                )
        return False

    def _module_bindings(
        self, removed: set[cst.ImportAlias]
    ) -> set[tuple[str, str]]:
        """(name, module) for each module-level import kept."""
        bindings: set[tuple[str, str]] = set()
        for record in self._imports:
            if not isinstance(record.scope, metadata.GlobalScope):
                continue
            for alias, target, bound_names in _import_targets(record.node):
                if alias in removed:
                    continue
                if isinstance(record.node, cst.Import) and not alias.asname:
                    bindings.update((name, name) for name in bound_names)
                else:
                    bindings.add((bound_names[0], target))
        return bindings


def _import_targets(
    node: cst.Import | cst.ImportFrom,
) -> Iterator[tuple[cst.ImportAlias, str, list[str]]]:
    """(alias, what it imports, the names it binds: its own first)."""
    if isinstance(node, cst.ImportFrom):
        if node.relative or node.module is None:
            return
        if isinstance(node.names, cst.ImportStar):
            return
        module = helpers.get_full_name_for_node(node.module)
        for alias in node.names:
            name = helpers.get_full_name_for_node(alias.name)
            bound = alias.evaluated_alias or name
            if module and name and bound:
                yield alias, f"{module}.{name}", [bound]
        return
    for alias in node.names:
        full = helpers.get_full_name_for_node(alias.name)
        if full is None:
            continue
        if alias.asname:
            yield alias, full, [alias.evaluated_alias or full]
        else:
            parts = full.split(".")
            yield (
                alias,
                full,
                [".".join(parts[:n]) for n in range(len(parts), 0, -1)],
            )


def _is_legacy_target(target: str) -> bool:
    """An import of a legacy module or name, or of anything in tf.contrib."""
    modules = (*_names.LEGACY_MODULES, "tensorflow.contrib")
    return target in _names.TF_LEGACY_NAMES or any(
        target == module or target.startswith(module + ".")
        for module in modules
    )


def _prune_import(
    node: cst.Import | cst.ImportFrom, removed: set[cst.ImportAlias]
) -> cst.Import | cst.ImportFrom | None:
    """`node` without the aliases in `removed`; None when none are left."""
    if isinstance(node.names, cst.ImportStar):
        return node
    names = [alias for alias in node.names if alias not in removed]
    if not names:
        return None
    if len(names) == len(node.names):
        return node
    names[-1] = names[-1].with_changes(comma=node.names[-1].comma)
    return node.with_changes(names=names)


def _prune_body(
    body: Sequence[cst.BaseStatement],
    removed: set[cst.ImportAlias],
    insert_at: int | None = None,
    inserted: Sequence[cst.BaseStatement] = (),
) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
    """Drops removed imports (their comments move to the next statement).

    Also inserts `inserted` before `body[insert_at]`. Returns the new body
    and the comment lines left over at its end.
    """
    result: list[cst.BaseStatement] = []
    carried: list[cst.EmptyLine] = []
    removed_first = False

    def append(statement: cst.BaseStatement) -> None:
        if carried or (removed_first and not result):
            assert isinstance(
                statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)
            )
            lines = [*carried, *statement.leading_lines]
            if not result:
                # The body starts here now: no blank lines before its first
                # comment or statement.
                while lines and lines[0].comment is None:
                    lines.pop(0)
            statement = statement.with_changes(leading_lines=lines)
            carried.clear()
        result.append(statement)

    for index, statement in enumerate(body):
        if index == insert_at:
            for new in inserted:
                append(new)
        if isinstance(statement, cst.SimpleStatementLine):
            small: list[cst.BaseSmallStatement] = []
            for part in statement.body:
                if isinstance(part, (cst.Import, cst.ImportFrom)):
                    kept = _prune_import(part, removed)
                    if kept is not None:
                        small.append(kept)
                else:
                    small.append(part)
            if not small:
                carried.extend(statement.leading_lines)
                removed_first = removed_first or not result
                continue
            if len(small) != len(statement.body):
                small[-1] = small[-1].with_changes(
                    semicolon=statement.body[-1].semicolon
                )
            statement = statement.with_changes(body=small)
        append(statement)
    if insert_at is not None and insert_at >= len(body):
        for new in inserted:
            append(new)
    return result, carried


class _ImportPruner(cst.CSTTransformer):
    """Drops removed imports inside blocks (the module's body is done apart)."""

    def __init__(self, removed: set[cst.ImportAlias]):
        super().__init__()
        self._removed = removed

    # Imports keep their identity (so _removed finds their aliases).
    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body, carried = _prune_body(updated_node.body, self._removed)
        if not body:
            body = [
                cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)
            ]
            carried = []
        return updated_node.with_changes(
            body=body, footer=[*carried, *updated_node.footer]
        )


def _insertion_index(module: cst.Module) -> int:
    """Where new imports go: after the last top-level import, else after
    the docstring."""
    index = 0
    for position, statement in enumerate(module.body):
        if isinstance(statement, cst.SimpleStatementLine) and any(
            isinstance(part, (cst.Import, cst.ImportFrom))
            for part in statement.body
        ):
            index = position + 1
    if index == 0 and module.get_docstring(clean=False) is not None:
        index = 1
    return index
