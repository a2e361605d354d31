"""Arguments the platform appends after the job's own (ModelArts PyTorch-GPU).

``--init_method tcp://IP:PORT --rank NODE --world_size NODES`` (``--k v`` or ``--k=v``). They
are node-level: ``--rank`` is the node index, ``--world_size`` the number of nodes. Whatever
is not consumed goes on to the start file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from launchers.address import parse_tcp_url
from launchers.config.limits import MAX_NODES
from launchers.errors import PlatformError
from launchers.platform.numbers import parse_int
from launchers.platform.sighting import Sighting

PYTORCH_PLATFORM_ARGS = ("init_method", "rank", "world_size")


def split_platform_args(args: Sequence[str], names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """Take ``--name value`` / ``--name=value`` for the given names; return (found, the rest).

    The rest keeps its order and goes to the start file (ModelArts also appends
    ``--data_url``/``--train_url`` and hyperparameters the script expects). Everything after
    a bare ``--`` is passed through untouched.
    """
    wanted = set(names)
    found: dict[str, str] = {}
    rest: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        token = items[i]
        if token == "--":
            rest.extend(items[i + 1 :])
            break
        name, value = None, None
        if token.startswith("--"):
            key, eq, val = token[2:].partition("=")
            norm = key.replace("-", "_")
            if norm in wanted:
                name = norm
                if eq:
                    value = val
                elif i + 1 < len(items) and not items[i + 1].startswith("--"):
                    value = items[i + 1]
                    i += 1
                else:
                    after = f" (it is followed by {items[i + 1][:80]!r})" if i + 1 < len(items) else ""
                    raise PlatformError(
                        f"platform argument --{key} has no value{after}; expected --{key} VALUE or --{key}=VALUE"
                    )
        if name is None:
            rest.append(token)
        else:
            assert value is not None
            if name in found and found[name] != value:
                raise PlatformError(
                    f"platform argument --{name} given twice with different values: {found[name]!r} and {value!r}"
                )
            found[name] = value
        i += 1
    return found, rest


def from_args(args: Mapping[str, str]) -> Sighting | None:
    """The ModelArts appended args as a sighting; None when there are none."""
    if not args:
        return None
    s = Sighting("modelarts-args")
    if "init_method" in args:
        host, port = parse_tcp_url(args["init_method"])
        s.put("master_addr", host, f"--init_method={args['init_method']}")
        s.put("master_port", port, f"--init_method={args['init_method']}")
    for name, fact, minimum, meaning in (
        ("world_size", "nnodes", 1, "the number of nodes"),
        ("rank", "node_rank", 0, "this node's index"),
    ):
        if name in args:
            value = parse_int(
                args[name], f"platform argument --{name}", minimum=minimum, maximum=MAX_NODES, meaning=meaning
            )
            s.put(fact, value, f"--{name}={value}")
    if "rank" in args and "world_size" not in args:
        raise PlatformError(
            "platform argument --rank was given without --world_size; expected both (node index and number of nodes)"
        )
    if "init_method" not in args and ("rank" in args or "world_size" in args):
        raise PlatformError("platform arguments --rank/--world_size were given without --init_method tcp://HOST:PORT")
    if "nnodes" not in s.facts:
        s.put("nnodes", 1, "--init_method alone (single node)")
        s.put("node_rank", 0, "--init_method alone (single node)")
    return s
