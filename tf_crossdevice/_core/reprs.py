"""Reprs that are the constructor call that builds the object again.

`ConstructorRepr` is a mixin: it records the arguments of the call that
made the object and prints that call, with the public class name and
without the arguments left at their defaults:
`HierarchicalCopyAllReduce(num_packs=8)`. `call_repr` formats such a call
for a class that keeps its arguments itself. Values of TensorFlow's
classes that print no constructor (`CommunicationOptions`, `ClusterSpec`)
are written as the `tf.` call that builds them.

>>> class Packs(ConstructorRepr):
...     def __init__(self, num_packs=1, name=None):
...         pass
>>> Packs(), Packs(4, name="grads"), Packs(num_packs=1)
(Packs(), Packs(num_packs=4, name='grads'), Packs())
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import tf_internal

_PASS_ON = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class ConstructorRepr:
    """Mixin: `repr` is the constructor call that built the object.

    The arguments are recorded in `__new__`, which sees the call as the
    caller wrote it, however the subclasses' constructors pass it on to
    each other. Copies (`copy.copy`, TensorFlow's deep copy of a strategy)
    make the object with `__new__` alone and then copy its state, the
    record included.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = super().__new__(cls)
        # Not `self.x = ...`: a frozen dataclass (CollectiveCluster)
        # refuses it.
        object.__setattr__(self, "_constructor_call", (args, kwargs))
        return self

    def __repr__(self) -> str:
        args, kwargs = getattr(self, "_constructor_call", ((), {}))
        return call_repr(type(self), *args, **kwargs)


def call_repr(cls: type, /, *args: Any, **kwargs: Any) -> str:
    """`cls(*args, **kwargs)` as code, leaving out arguments at defaults.

    >>> call_repr(tf.distribute.MirroredStrategy, devices=["/cpu:0"])
    "MirroredStrategy(devices=['/cpu:0'])"
    """
    return _format_call(cls.__name__, constructor_signature(cls), args, kwargs)


def constructor_signature(cls: type) -> inspect.Signature:
    """The parameters of `cls(...)`.

    A constructor that only passes `*args, **kwargs` on (a mixin's) is
    skipped for the next one in the method resolution order.
    """
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = list(inspect.signature(init).parameters.values())[1:]
        if parameters and all(p.kind in _PASS_ON for p in parameters):
            continue
        return inspect.Signature(parameters)
    return inspect.Signature()


def value_repr(value: Any) -> str:
    """`repr(value)`, with TensorFlow's values written as their `tf.` call.

    >>> value_repr([tf.distribute.experimental.CommunicationOptions(
    ...     bytes_per_pack=1024, implementation="ring")])
    '[tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1024, \
implementation=tf.distribute.experimental.CommunicationImplementation.RING)]'
    """
    if isinstance(value, tf_internal.CommunicationOptions):
        fields = {
            "bytes_per_pack": value.bytes_per_pack,
            "timeout_seconds": value.timeout_seconds,
            "implementation": value.implementation,
        }
        signature = constructor_signature(tf_internal.CommunicationOptions)
        name = "tf.distribute.experimental.CommunicationOptions"
        return _format_call(name, signature, (), fields)
    if isinstance(
        value, tf.distribute.experimental.CommunicationImplementation
    ):
        return (
            "tf.distribute.experimental.CommunicationImplementation."
            f"{value.name}"
        )
    if isinstance(value, tf.train.ClusterSpec):
        return f"tf.train.ClusterSpec({value.as_dict()!r})"
    if isinstance(value, tf.Variable):
        # The values themselves would print every weight of a model.
        return (
            f"<tf.Variable {value.name!r} shape={value.shape} "
            f"dtype={value.dtype.name}>"
        )
    if type(value) is list:
        return f"[{', '.join(value_repr(v) for v in value)}]"
    if type(value) is tuple:
        items = [value_repr(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if type(value) is dict:
        pairs = (f"{value_repr(k)}: {value_repr(v)}" for k, v in value.items())
        return f"{{{', '.join(pairs)}}}"
    return repr(value)


def _format_call(
    name: str,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # A signature this module cannot read: as given.
        parts = [value_repr(a) for a in args]
        parts += [f"{k}={value_repr(v)}" for k, v in kwargs.items()]
        return f"{name}({', '.join(parts)})"
    parameters = signature.parameters
    # Arguments before a non-empty *args can only be written positionally.
    positional = any(
        parameters[k].kind is inspect.Parameter.VAR_POSITIONAL and v
        for k, v in bound.arguments.items()
    )
    parts = []
    for key, value in bound.arguments.items():
        kind = parameters[key].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            parts += [value_repr(v) for v in value]
            positional = False
        elif kind is inspect.Parameter.VAR_KEYWORD:
            parts += [f"{k}={value_repr(v)}" for k, v in value.items()]
        elif positional or kind is inspect.Parameter.POSITIONAL_ONLY:
            parts.append(value_repr(value))
        elif not _is_default(value, parameters[key].default):
            parts.append(f"{key}={value_repr(value)}")
    return f"{name}({', '.join(parts)})"


def _is_default(value: Any, default: Any) -> bool:
    if default is inspect.Parameter.empty:
        return False
    if value is default:
        return True
    if type(value) is not type(default):
        return False
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - not comparable: not the default.
        return False
