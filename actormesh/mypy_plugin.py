"""A mypy plugin that types ``mesh.step`` from the actor class: ``Endpoint[P, R]`` of ``step``.

``ProcMesh.spawn(name, Trainer)`` gives an ``ActorMesh[Trainer]`` whose endpoints are reached
through ``ActorMesh.__getattr__``; no annotation can say "the endpoint of ``T`` named like the
attribute", so without this plugin ``mesh.step`` is ``Endpoint[Any, Any]`` and nothing about a
call is checked. With it (``plugins = ["actormesh.mypy_plugin"]`` in the mypy configuration),
``mesh.step.call(lr="x")`` is checked against ``def step(self, lr: float)`` and a name that is
no endpoint of ``Trainer`` is reported, as ``ActorMesh.__getattr__`` would raise at run time.

Only mypy imports this module.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.errorcodes import ATTR_DEFINED
from mypy.nodes import Decorator, MemberExpr
from mypy.plugin import AttributeContext, Plugin
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    Parameters,
    Type,
    TypeOfAny,
    get_proper_type,
)

_MESH = "actormesh.runtime.meshes.actor_mesh.ActorMesh"
_ENDPOINT = "actormesh.runtime.meshes.endpoint.Endpoint"
_PROPERTIES = (
    "actormesh.runtime.actors.actor.EndpointProperty",
    "actormesh.runtime.actors.actor.AsyncEndpointProperty",
)


class ActorMeshPlugin(Plugin):
    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        # mypy asks with "<class that defines __getattr__>.<attribute>" for names that only
        # __getattr__ answers.
        if fullname.rpartition(".")[0] == _MESH:
            return _endpoint_type
        return None


def _endpoint_type(ctx: AttributeContext) -> Type:
    mesh = get_proper_type(ctx.type)
    if not isinstance(mesh, Instance) or not mesh.args:
        return ctx.default_attr_type
    actor = get_proper_type(mesh.args[0])
    if not isinstance(actor, Instance):
        return ctx.default_attr_type  # ActorMesh[Any], or a type variable: nothing to check
    if not isinstance(ctx.context, MemberExpr):
        return ctx.default_attr_type
    name = ctx.context.name
    if any(name in info.names for info in mesh.type.mro if info.fullname != "builtins.object"):
        return ctx.default_attr_type  # ActorMesh's own (initialized, stop): not an endpoint
    for info in actor.type.mro:
        node = info.names.get(name)
        if node is None:
            continue
        if isinstance(node.node, Decorator):
            prop = get_proper_type(node.node.var.type)
            if prop is None:  # not inferred yet: unchecked rather than a false error
                return ctx.default_attr_type
            if isinstance(prop, AnyType):
                # A method declared "-> Any" matches both overloads of endpoint() (async def and
                # def), so mypy calls the decorated type Any: its parameters still count.
                return _from_signature(node.node, ctx.default_attr_type)
            default = get_proper_type(ctx.default_attr_type)  # Endpoint[Any, Any]
            if (
                isinstance(prop, Instance)
                and prop.type.fullname in _PROPERTIES
                and isinstance(default, Instance)
                and default.type.fullname == _ENDPOINT
            ):
                return default.copy_modified(args=prop.args)
        break
    ctx.api.fail(f'"{actor.type.name}" has no endpoint "{name}"', ctx.context, code=ATTR_DEFINED)
    return AnyType(TypeOfAny.from_error)


def _from_signature(decorator: Decorator, default: Type) -> Type:
    method = get_proper_type(decorator.func.type)
    endpoint = get_proper_type(default)
    if not isinstance(method, CallableType) or not isinstance(endpoint, Instance):
        return default
    params = Parameters(method.arg_types[1:], method.arg_kinds[1:], method.arg_names[1:])
    return endpoint.copy_modified(args=[params, AnyType(TypeOfAny.explicit)])


def plugin(version: str) -> type[Plugin]:
    return ActorMeshPlugin
