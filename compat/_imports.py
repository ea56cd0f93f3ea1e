"""Import statements: those legacy code no longer uses, those new code needs.

The rewriting tells `Imports` which names it spelled (`spelling`) and which
uses of legacy names it replaced (`drop_uses`). At the module's end the
legacy imports left without a use go, their comments moving to the next
statement, and the imports the new code needs come after the last top-level
import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import libcst as cst
from libcst import helpers, metadata

from . import _names

# Import statements the rewritten code may need, by the name it binds and the
# module bound to it; written in this order after the last top-level import.
_STATEMENTS = {
    "import tensorflow as tf": ("tf", "tensorflow"),
    "import tensorflow": ("tensorflow", "tensorflow"),
    "import tf_crossdevice": ("tf_crossdevice", "tf_crossdevice"),
    "import tf_crossdevice.compat": (
        "tf_crossdevice.compat",
        "tf_crossdevice.compat",
    ),
}


@dataclasses.dataclass
class ImportRecord:
    """An import statement, as the original module has it."""

    node: cst.Import | cst.ImportFrom
    scope: metadata.Scope | None


class Imports:
    """A module's import statements, and the ones its new code needs.

    Attributes:
        records: the module's import statements, in order.
    """

    def __init__(self) -> None:
        self.records: list[ImportRecord] = []
        # Import statements the new code needs -> (name, module) they bind.
        self._needs: dict[str, tuple[str, str]] = {}
        # Original name accesses the new code no longer holds.
        self._consumed: set[cst.CSTNode] = set()

    def drop_uses(self, nodes: Iterable[cst.CSTNode]) -> None:
        """Notes name accesses (original nodes) the new code no longer has."""
        self._consumed.update(nodes)

    def spelling(self, dotted: str, scope: metadata.Scope | None) -> str:
        """`dotted` (tf.X or tf_crossdevice.X) as code in `scope`.

        Notes the import it needs unless `scope` sees that name already.
        Where an import binds `tf` to another module (`import
        tensorflow.compat.v1 as tf`), TensorFlow's names are spelled
        `tensorflow.`.
        """
        if dotted.startswith("tf."):
            if _imported_as(scope, "tf") - {"tensorflow", ""}:
                dotted = "tensorflow." + dotted[len("tf.") :]
                statement = "import tensorflow"
            else:
                statement = "import tensorflow as tf"
        elif dotted.startswith("tf_crossdevice.compat."):
            statement = "import tf_crossdevice.compat"
        else:
            statement = "import tf_crossdevice"
        name, module = _STATEMENTS[statement]
        if not _imported_as(scope, name) & {module, ""}:
            self._needs[statement] = (name, module)
        return dotted

    def missing(self, removed: set[cst.ImportAlias]) -> list[str]:
        """The import statements the new code needs that the module lacks
        once the aliases in `removed` are gone, in the order to write them."""
        bound = self._module_bindings(removed)
        missing = [
            statement
            for statement, binding in self._needs.items()
            if binding not in bound
        ]
        if "import tf_crossdevice.compat" in missing:
            # It binds tf_crossdevice too.
            missing = [s for s in missing if s != "import tf_crossdevice"]
        order = list(_STATEMENTS)
        missing.sort(key=lambda s: (order.index(s) if s in order else 99, s))
        return missing

    def unused_legacy_aliases(
        self, record: ImportRecord
    ) -> list[cst.ImportAlias]:
        """The aliases of a legacy import whose every use was rewritten."""
        unused = []
        for alias, target, bound_names in import_targets(record.node):
            if not is_legacy_target(target) or record.scope is None:
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

    def _uses_left(self, record: ImportRecord, name: str) -> bool:
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
        for record in self.records:
            if not isinstance(record.scope, metadata.GlobalScope):
                continue
            for alias, target, bound_names in import_targets(record.node):
                if alias in removed:
                    continue
                if isinstance(record.node, cst.Import) and not alias.asname:
                    bindings.update((name, name) for name in bound_names)
                else:
                    bindings.add((bound_names[0], target))
        return bindings


def _imported_as(scope: metadata.Scope | None, name: str) -> set[str]:
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
            is_legacy_target(target) for _, target, _ in import_targets(node)
        ):
            names = assignment.get_qualified_names_for(name)
            bound.update(qualified.name for qualified in names)
    return bound


def import_targets(
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


def is_legacy_target(target: str) -> bool:
    """An import of a legacy module or name, or of anything in tf.contrib."""
    modules = (*_names.LEGACY_MODULES, "tensorflow.contrib")
    return target in _names.TF_LEGACY_NAMES or any(
        target == module or target.startswith(module + ".")
        for module in modules
    )


def prune_import(
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


def prune_body(
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
                    kept = prune_import(part, removed)
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


class ImportPruner(cst.CSTTransformer):
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
        body, carried = prune_body(updated_node.body, self._removed)
        if not body:
            body = [
                cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)
            ]
            carried = []
        return updated_node.with_changes(
            body=body, footer=[*carried, *updated_node.footer]
        )


def insertion_index(module: cst.Module) -> int:
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
