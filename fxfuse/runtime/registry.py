"""How fxfuse's ops enter the dispatcher: `@fused_op("fxfuse::name")`, a lighter
`torch.library.custom_op`.

A compiled graph calls each fused op once per forward, and at prefill the host must keep ahead of
the GPU. `torch.library.custom_op` routes a call through Python three times (an autograd kernel,
a redispatch, a backend wrapper that checks aliasing), converting every argument each time. The
ops here are defined with the same inferred schema and the `pt2_compliant_tag`, and one Python
kernel registered at CompositeExplicitAutograd: a call crosses into Python once. There is no
autograd formula (as with a custom_op without one): outputs never require grad.

The decorated object keeps custom_op's surface that fxfuse uses: calling it calls the op, and
`register_fake` registers the fake kernel. `impl` is the undecorated Python implementation.

A variant op (the same arguments, more outputs: the with-norm ops) takes its schema from the base
op, `fused_op(name, schema=variant_schema(base, "(Tensor, Tensor, Tensor)"))`, and its kernel
takes the arguments positionally, as the dispatcher passes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

_LIBS: dict[str, torch.library.Library] = {}


def _library(namespace: str) -> torch.library.Library:
    lib = _LIBS.get(namespace)
    if lib is None:
        lib = _LIBS[namespace] = torch.library.Library(namespace, "FRAGMENT")
    return lib


class FusedOp:
    """One registered op: `FusedOp(...)(*args)` calls `torch.ops.<ns>.<name>.default`."""

    def __init__(
        self, qualname: str, impl: Callable, mutates_args: Iterable[str], schema: str | None = None
    ):
        namespace, sep, name = qualname.partition("::")
        if not sep or not namespace or not name:
            raise ValueError(f"qualname: expected 'namespace::name', got {qualname!r}")
        if schema is None:
            schema = torch.library.infer_schema(impl, mutates_args=tuple(mutates_args))
        lib = _library(namespace)
        lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        lib.impl(name, impl, "CompositeExplicitAutograd")
        self.qualname = qualname
        self.impl = impl
        self._lib = lib
        self.default: torch._ops.OpOverload = getattr(getattr(torch.ops, namespace), name).default
        self.__doc__ = impl.__doc__
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)

    def register_fake(self, fn: Callable) -> Callable:
        """The op's fake (meta) kernel, as `torch.library.register_fake` takes it."""
        torch.library.register_fake(self.qualname, fn, lib=self._lib)
        return fn

    def __repr__(self) -> str:
        return f"<fxfuse op {self.qualname}>"


def fused_op(
    qualname: str, *, mutates_args: Iterable[str] = (), schema: str | None = None
) -> Callable[[Callable], FusedOp]:
    """Decorator: define `qualname` from the function's annotations (as torch.library.custom_op
    infers them), or from `schema` ("(args) -> returns", no name), and register the function as
    its kernel for every backend."""
    if isinstance(mutates_args, str):
        raise ValueError(
            f"mutates_args: expected an iterable of argument names, got {mutates_args!r}"
        )
    if schema is not None and tuple(mutates_args):
        raise ValueError("mutates_args: a schema given as a string states its own mutations")

    def register(impl: Callable) -> FusedOp:
        return FusedOp(qualname, impl, mutates_args, schema)

    return register


def variant_schema(base: FusedOp, returns: str) -> str:
    """`base`'s argument list with other returns ("(Tensor, Tensor)"): the schema of an op that
    takes the same arguments and returns more."""
    text = str(base.default._schema)
    return text[text.index("(") : text.rindex(" -> ")] + " -> " + returns
