"""libcst helpers the rewriting shares: code, attribute chains, arguments.

>>> call = cst.parse_expression("f(1, b=x.y)")
>>> bind(call, ("a", "b"))
({'a': 0, 'b': 1}, [])
>>> [code_of(node) for node in chain(call.args[1].value)]
['x.y', 'x']
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst


def code_of(node: cst.CSTNode) -> str:
    """The source code of `node`, on its own."""
    return cst.Module(body=[]).code_for_node(node)


def chain(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`a.b.c`, `a.b`, `a`: the node and the attribute chain inside it."""
    while isinstance(node, cst.Attribute):
        yield node
        node = node.value
    yield node


def is_none(node: cst.BaseExpression) -> bool:
    """Whether `node` is the literal `None`."""
    return isinstance(node, cst.Name) and node.value == "None"


def bind(
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


def with_args(call: cst.Call, args: Sequence[cst.Arg]) -> cst.Call:
    """`call` with `args`, the last one ending as the call's last did."""
    args = list(args)
    if args and call.args:
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)


def with_leading_args(
    call: cst.Call, leading: Sequence[cst.Arg], args: Sequence[cst.Arg]
) -> cst.Call:
    """`call` with `leading` (new arguments) before `args`.

    Each new argument goes on a line of its own where the call's first
    argument is on a line of its own, else after the opening parenthesis.

    >>> call = cst.parse_expression("f(\\n    b=2,\\n)")
    >>> a = keyword_arg("a", cst.Integer("1"))
    >>> print(code_of(with_leading_args(call, [a], call.args)))
    f(
        a=1,
        b=2,
    )
    """
    before = call.whitespace_before_args
    if isinstance(before, cst.ParenthesizedWhitespace):
        # Without the first line's comment, which stays where it was.
        after: cst.BaseParenthesizableWhitespace = before.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=[]
        )
    else:
        after = cst.SimpleWhitespace(" ")
    new = [
        arg.with_changes(comma=cst.Comma(whitespace_after=after))
        for arg in leading
    ]
    if new and not args:
        new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return with_args(call, [*new, *args])


_EQUAL = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""),
    whitespace_after=cst.SimpleWhitespace(""),
)


def keyword_arg(keyword: str, value: cst.BaseExpression) -> cst.Arg:
    """`keyword=value`, as a formatter writes it."""
    return cst.Arg(value, keyword=cst.Name(keyword), equal=_EQUAL)


def as_keyword(arg: cst.Arg, keyword: str) -> cst.Arg:
    """`arg` passed as `keyword=`, by position or keyword alike."""
    if arg.keyword is not None:
        return arg.with_changes(keyword=cst.Name(keyword))
    return arg.with_changes(keyword=cst.Name(keyword), equal=_EQUAL)
