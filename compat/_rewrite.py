"""The migration command's rewriting: legacy cross-device code to TF 2.21.

A libcst transformer works on the concrete syntax tree, so comments and
formatting survive. Names are resolved through the module's imports
(libcst's QualifiedNameProvider), so `distribute.X` is a legacy name only
where `distribute` was imported from a legacy module. What to rewrite, and
why a name cannot be, comes from `_names`; calls that change shape are
checked and built in `_calls`, import statements fixed in `_imports`, and
what happened is reported as `_report` findings. Pure libcst: no TensorFlow
import, so the command starts fast.

>>> print(rewrite("from tf_crossdevice import compat\\n"
...               "ops = compat.AllReduceCrossTowerOps('nccl')\\n").code)
import tf_crossdevice
ops = tf_crossdevice.AllReduceCrossDeviceOps('nccl')
<BLANKLINE>
"""

from __future__ import annotations

import ast
import dataclasses
import re

import libcst as cst
from libcst import helpers, metadata

from . import _calls, _names
from ._imports import (
    ImportPruner,
    ImportRecord,
    Imports,
    insertion_index,
    is_legacy_target,
    prune_body,
    prune_import,
)
from ._report import Finding, Kind, ParseError, Rewrite, one_line
from ._syntax import as_keyword, bind, chain, code_of, is_none, with_args

# A LEGACY replacement that is code: a dotted name the command can write.
_DOTTED = re.compile(r"(tf|tf_crossdevice)(\.\w+)+")
# Keywords that hold the reduce op in REDUCE_METHODS calls.
_REDUCE_OP_KEYWORDS = ("aggregation", "method_string", "reduce_op")
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


@dataclasses.dataclass(frozen=True)
class _Match:
    """A use of a legacy name, and where it was imported from."""

    legacy: _names.Legacy
    source: str  # "contrib", "compat" or "tensorflow".


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
        self._imports = Imports()
        # Calls left exactly as they were (see visit_Call).
        self._untouched: set[cst.Call] = set()

    # Reports.

    def _report(self, node: cst.CSTNode, kind: Kind, message: str) -> None:
        start = self.get_metadata(metadata.PositionProvider, node).start
        key = (start.line, start.column, len(self.findings))
        self.findings.append((key, Finding(start.line, kind, message)))

    def _changed(
        self, node: cst.CSTNode, old: str, new: str, why: str = ""
    ) -> None:
        message = f"{one_line(old)} -> {one_line(new)}"
        self._report(
            node, Kind.CHANGED, f"{message} ({why})" if why else message
        )

    def _not_converted(self, node: cst.CSTNode, what: str, why: str) -> None:
        self._report(node, Kind.NOT_CONVERTED, f"{one_line(what)} ({why})")

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
        *_, root = chain(node)
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
                *_, root = chain(node)
                if self._qualified_name(root) == "tensorflow.compat.v1":
                    return None
            legacy = _names.LEGACY[_names.TF_LEGACY_NAMES[name]]
            return _Match(legacy, "tensorflow")
        if name in _names.CONTRIB_ONLY:
            return _Match(_names.CONTRIB_ONLY[name], "contrib")
        module, _, attribute = name.rpartition(".")
        if module in _names.LEGACY_MODULES and attribute in _names.LEGACY:
            source = (
                "compat" if module == "tf_crossdevice.compat" else "contrib"
            )
            return _Match(_names.LEGACY[attribute], source)
        return None

    def _expression(self, dotted: str, site: cst.CSTNode) -> cst.BaseExpression:
        """`dotted` (tf.X or tf_crossdevice.X) as code at `site`, noting the
        import it needs (see `Imports.spelling`)."""
        scope = self.get_metadata(metadata.ScopeProvider, site, None)
        return cst.parse_expression(self._imports.spelling(dotted, scope))

    def _replace(
        self,
        original: cst.BaseExpression,
        updated: cst.BaseExpression,
        new: cst.BaseExpression,
    ) -> cst.BaseExpression:
        """`new` in place of `original`, keeping its parentheses."""
        self._imports.drop_uses(chain(original))
        self._changed(original, code_of(original), code_of(new))
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
        self._imports.records.append(ImportRecord(node, scope))
        if isinstance(node, cst.ImportFrom) and isinstance(
            node.names, cst.ImportStar
        ):
            module = helpers.get_full_name_for_node(node.module or node)
            if not node.relative and module and is_legacy_target(module):
                # Its names cannot be told from the module's own.
                self._not_converted(
                    node,
                    code_of(node),
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
        if match.legacy.name in _calls.SPECIAL_CALLS and self._is_call_func(
            original
        ):
            return updated  # leave_Call rewrites the whole call.
        new = self._rename(original, updated, match)
        if (
            match.legacy.name == "CollectiveAllReduceStrategy"
            and not self._is_type_checked(original)
        ):
            # A call through it would pass TF 1's arguments.
            self._not_converted(original, code_of(new), match.legacy.change)
        return new

    def _is_type_checked(self, node: cst.CSTNode) -> bool:
        """Whether `node` is the class (or one of the classes) an isinstance
        or issubclass call checks against."""
        parent = self.get_metadata(metadata.ParentNodeProvider, node)
        if isinstance(parent, cst.Element):  # In a tuple of classes.
            in_tuple = self.get_metadata(metadata.ParentNodeProvider, parent)
            parent = self.get_metadata(metadata.ParentNodeProvider, in_tuple)
        if not isinstance(parent, cst.Arg):
            return False
        call = self.get_metadata(metadata.ParentNodeProvider, parent)
        return (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Name)
            and call.func.value in ("isinstance", "issubclass")
            and call.args.index(parent) == 1
        )

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
        self._not_converted(original, code_of(updated), legacy.replacement)
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
        if any(inner in self._matched for inner in chain(node)):
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
        self._not_converted(node, code_of(what), why)

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
        match = self._match(node.func)
        if match is None:
            return True
        why = _calls.why_not_convertible(match.legacy, node)
        if why is None:
            return True
        self._not_converted(node, code_of(node), why)
        self._untouched.add(node)
        return False

    def leave_Call(
        self, original_node: cst.Call, updated_node: cst.Call
    ) -> cst.BaseExpression:
        if original_node in self._untouched:
            return updated_node
        match = self._match(original_node.func)
        if match is not None and match.legacy.name in _calls.SPECIAL_CALLS:
            if match.legacy.name == "AllReduceSpecTuple":
                return self._spec_tuple(original_node, updated_node)
            if match.legacy.name == "choose_the_best":
                return self._choose_the_best(original_node, updated_node, match)
            if match.legacy.name == "CollectiveAllReduceStrategy":
                return self._collective_strategy(
                    original_node, updated_node, match
                )
            return self._mirrored_strategy(original_node, updated_node, match)
        func = updated_node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in _names.KEYWORD_METHODS
        ):
            return self._method_call(original_node, updated_node)
        return updated_node

    def _spec_tuple(self, original: cst.Call, updated: cst.Call) -> cst.Tuple:
        new = _calls.spec_tuple(original, updated)
        self._imports.drop_uses(chain(original.func))
        self._changed(original, code_of(original), code_of(new))
        return new

    def _choose_the_best(
        self, original: cst.Call, updated: cst.Call, match: _Match
    ) -> cst.BaseExpression:
        bound, _ = bind(original, _calls.CHOOSE_PARAMETERS)
        replacement = match.legacy.replacement
        new_func = self._replace(
            original.func,
            updated.func,
            self._expression(replacement, original),
        )
        if "session_config" in bound:
            index = bound["session_config"]
            config = original.args[index].value
            if not is_none(config):
                self._not_converted(
                    original.args[index],
                    f"session_config={code_of(config)}",
                    match.legacy.change,
                )
        devices = updated.args[bound["devices"]]
        return with_args(updated.with_changes(func=new_func), [devices])

    def _mirrored_strategy(
        self, original: cst.Call, updated: cst.Call, match: _Match
    ) -> cst.BaseExpression:
        bound, _ = bind(original, *_calls.STRATEGY_PARAMETERS)
        num_gpus = bound.get("num_gpus")
        from_num_gpus = num_gpus is not None and not is_none(
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
                new = as_keyword(arg, "devices").with_changes(
                    value=_calls.gpu_devices(arg.value)
                )
                self._changed(
                    old,
                    f"num_gpus={code_of(old.value)}",
                    f"devices={code_of(new.value)}",
                )
                arg = new
            elif name == "cross_tower_ops":
                keyword = _names.KEYWORDS["cross_tower_ops"]
                arg = as_keyword(arg, keyword)
                self._changed(old, "cross_tower_ops=", f"{keyword}=")
            args.append(arg)
        return with_args(updated.with_changes(func=new_func), args)

    def _collective_strategy(
        self, original: cst.Call, updated: cst.Call, match: _Match
    ) -> cst.BaseExpression:
        new_func = self._replace(
            original.func,
            updated.func,
            self._expression(match.legacy.replacement, original),
        )
        call, changes = _calls.collective_strategy(
            original,
            updated.with_changes(func=new_func),
            lambda dotted: self._expression(dotted, original),
        )
        for node, old, new, why in changes:
            self._changed(node, old, new, why)
        return call

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
            self._changed(node, code_of(node), code_of(new))
            return new.with_changes(lpar=node.lpar, rpar=node.rpar)
        if member in _names.NOT_REDUCTIONS:
            self._not_converted(
                node, code_of(node), _names.NOT_REDUCTIONS[member]
            )
        return None

    # Imports.

    def leave_Module(
        self, original_node: cst.Module, updated_node: cst.Module
    ) -> cst.Module:
        removed: set[cst.ImportAlias] = set()
        for record in self._imports.records:
            aliases = self._imports.unused_legacy_aliases(record)
            removed.update(aliases)
            if aliases:
                kept = prune_import(record.node, removed)
                self._report(
                    record.node,
                    Kind.CHANGED,
                    f"{one_line(code_of(record.node))} -> "
                    + (
                        "(removed, no uses left)"
                        if kept is None
                        else one_line(code_of(kept))
                    ),
                )
        missing = self._imports.missing(removed)
        new_imports = [cst.parse_statement(statement) for statement in missing]
        insert_at = insertion_index(original_node)
        line = 1
        if insert_at > 0:
            anchor = original_node.body[insert_at - 1]
            line = self.get_metadata(metadata.PositionProvider, anchor).end.line
        for statement in missing:
            finding = Finding(line, Kind.CHANGED, f"(no import) -> {statement}")
            self.findings.append(((line, 0, len(self.findings)), finding))
        if not removed and not new_imports:
            return updated_node
        module = updated_node.visit(ImportPruner(removed))
        assert isinstance(module, cst.Module)
        body, carried = prune_body(module.body, removed, insert_at, new_imports)
        footer = [*carried, *module.footer]
        return module.with_changes(body=body, footer=footer)
