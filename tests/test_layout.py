"""The code's shape, checked: no import cycle, small modules, short functions, clean layering.

These are the rules the layout was built to (issue 12); a change that breaks one fails here
with the offending module or function named, instead of the tree drifting back.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGES = ("launchers", "bootstrap")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_files(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name → file, for every project module (packages by their __init__)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every project module ``name`` imports anywhere in its file: top level, functions, TYPE_CHECKING.

    ``from pkg import sub`` counts as importing ``pkg.sub`` alone: the package's own
    ``__init__`` runs first whatever the importer does, so it is no edge of a cycle.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            subs = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in known]
            if len(subs) < len(node.names) and module in known:
                yield module
            yield from subs


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: set(imported_modules(name, path, known)) - {name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``a → b → … → a``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_project_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def package_of(name: str, files: dict[str, Path]) -> str:
    """A module's package (a module right under ``launchers/`` or ``bootstrap/`` stands for itself)."""
    if files[name].name == "__init__.py":
        return name
    parent = name.rpartition(".")[0]
    return name if parent == "launchers" else parent


def package_graph() -> dict[str, set[str]]:
    """Package → the packages its modules import (every import: lazy, in functions, TYPE_CHECKING)."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        source = package_of(name, files)
        graph.setdefault(source, set()).update(package_of(t, files) for t in targets)
        graph[source].discard(source)
    return graph


def benchmark_graph() -> dict[str, set[str]]:
    """Benchmark module → the benchmark modules it imports, whichever name it imports them by.

    A script run as ``python benchmarks/NAME.py`` has ``benchmarks/`` first on ``sys.path`` and can import a
    sibling by its bare name (``import fault_recovery``); a package's module imports ``benchmarks.recovery.x``.
    Both are edges to the same file.
    """
    files = module_files(("benchmarks",))
    bare = {name.removeprefix("benchmarks."): name for name in files if name != "benchmarks"}
    known = set(files) | set(bare)
    return {
        name: {bare.get(target, target) for target in imported_modules(name, path, known)} - {name}
        for name, path in files.items()
    }


def test_no_import_cycle_between_benchmarks() -> None:
    """A benchmark's modes once imported each other in a circle (fault_recovery → its --hosts module →
    fault_recovery, issue 46): what modes share lives in a module that imports none of them."""
    graph = benchmark_graph()
    assert graph["benchmarks.fault_recovery"] and graph["benchmarks.fault_burst"], "found no import between them"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between benchmarks: " + " → ".join(cycle or [])


def test_no_import_cycle_between_packages() -> None:
    """Lazy imports hide a module cycle from the interpreter, not from a reader: packages form layers (issue 33)."""
    cycle = find_cycle(package_graph())
    assert cycle is None, "package import cycle: " + " → ".join(cycle or [])


def test_bootstrap_prepares_nodes_without_the_engines() -> None:
    """bootstrap/ runs on a node before training; it must not depend on how plans are made or run."""
    graph = import_graph()
    offenders = {
        f"{name} → {target}"
        for name, targets in graph.items()
        if name.startswith("bootstrap")
        for target in targets
        if target.startswith(("launchers.engines", "launchers.run", "launchers.cli"))
    }
    assert not offenders, sorted(offenders)


def test_the_training_side_imports_nothing_of_the_launcher() -> None:
    """launchers.elastic is imported by training scripts: it must not pull in the launcher's parts."""
    graph = import_graph()
    offenders = {
        f"{name} → {target}"
        for name, targets in graph.items()
        if name.startswith("launchers.elastic")
        for target in targets
        if not target.startswith("launchers.elastic")
        # launchers.store_wait: stdlib only, shared by the standbys and elastic.recoverable's rejoining ranks
        and target not in ("launchers.log", "launchers.elastic.ipc.import_report", "launchers.store_wait")
    }
    assert not offenders, sorted(offenders)


def layer_offenders(layer: str, forbidden: tuple[str, ...]) -> set[str]:
    """Every import from a module of ``layer`` into one of the ``forbidden`` packages (``a → b``)."""
    return {
        f"{name} → {target}"
        for name, targets in import_graph().items()
        if name == layer or name.startswith(layer + ".")
        for target in targets
        if target.startswith(forbidden)
    }


def test_the_control_plane_stands_below_run_and_health() -> None:
    """launchers.control is the one plane run/ and health/ both use; it must know neither (issue 24)."""
    assert not layer_offenders("launchers.control", ("launchers.run", "launchers.health", "launchers.cli")), (
        "the control plane may use only launchers.log, config and platform types"
    )


SOCKET_FREE_CONTROL = (
    *("messages", "codec", "topics", "reductions"),  # the protocol
    *("effects", "roster", "membership", "life", "gathers"),  # the lives and the decisions
    *("hub_view", "status_mirror"),  # what is read of them
)
SOCKET_OWNERS = ("hub", "agent_core", "driver", "agent")


def top_level_imports(path: Path) -> set[str]:
    """The first part of every module ``path`` imports (``zmq`` for ``import zmq.asyncio``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found


def test_the_control_planes_protocol_and_decisions_need_no_socket() -> None:
    """The protocol's definition, the node lives and the hub's membership decisions are values and pure
    decisions (state in, effects out), tested without a socket: they import neither pyzmq nor the modules
    that own sockets (the hub, an agent, the driver)."""
    graph = import_graph()
    owners = {f"launchers.control.{name}" for name in SOCKET_OWNERS}
    offenders = []
    for name in SOCKET_FREE_CONTROL:
        module = f"launchers.control.{name}"
        if "zmq" in top_level_imports(ROOT / "launchers" / "control" / f"{name}.py"):
            offenders.append(f"{module} → zmq")
        offenders += [f"{module} → {target}" for target in sorted(graph[module] & owners)]
    assert not offenders, offenders


def test_health_does_not_reach_into_run() -> None:
    """run/ calls the health check before it starts ranks (run → health → control): never the other way."""
    assert not layer_offenders("launchers.health", ("launchers.run", "launchers.cli"))


def test_modules_stay_small() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in module_files().values()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_functions_stay_short() -> None:
    long = {}
    for path in module_files().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_package_is_declared_for_the_wheel() -> None:
    """pyproject lists the packages by hand (templates/ is mapped in): a new subpackage must be added."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {name for name, path in module_files().items() if path.name == "__init__.py"}
    assert on_disk - declared == set(), "add to [tool.setuptools] packages in pyproject.toml"


def test_persist_standby_and_observe_stand_below_run() -> None:
    """run/ supervises and restarts; the agent half of checkpointing, the standbys and observation serve it."""
    for layer in ("launchers.persist", "launchers.standby", "launchers.observe"):
        assert not layer_offenders(layer, ("launchers.run", "launchers.cli")), layer


def test_run_holds_supervision_and_the_restart_loop_only() -> None:
    """Planning (``launchers.planning``, ``preflight``, ``rank_env``) and observation (``launchers.observe``) have
    their own rooms; a module added to run/ is one of these or says here why it belongs (issue 33 item 6)."""
    supervision = {"supervisor", "streams", "teardown", "signal_router", "watchdog", "hang", "labels", "taskd_manager"}
    supervision.add("hang_response")  # the supervisor's answer to a hung rank (job_event_response: to the job)
    supervision.add("hang_stacks")  # the stacks of a hang's processes, before anything is killed
    supervision.add("in_place")  # the supervisor's answer to a peer's failure when the ranks recover in place
    supervision.add("shm_sweep")  # the watchdog's cleanup for runs whose watchdog died too: what processes left
    supervision.add("rejoin")  # the bound on a group re-formed in place: the supervisor's in-place answer's clock
    supervision.add("left_behind")  # which survivor told ``go`` the in-place answer replaces instead of waiting
    supervision.add("standby_response")  # the supervisor's part in warm standbys: fork first, refill after start-up
    restart_loop = {"runner", "restarts", "membership", "attempt", "retry_policy", "job_wide", "job_event_response"}
    restart_loop.add("shm_reclaim")  # what an attempt leaves in shared memory, unlinked off the way to the next
    run = {name.split(".")[-1] for name in module_files() if name.startswith("launchers.run.")}
    assert run - supervision - restart_loop == set()
    assert not [name for name in module_files() if name.startswith("launchers.run.") and name.count(".") > 2]


# launchers.elastic's rooms (issue 33 item 6) → the other rooms each may import. The facade's
# level (``launchers.elastic`` and the modules a script imports: guard, checkpoint, pytorch...)
# stands above them all and ``integrations`` above that; a room never imports either.
ELASTIC_ROOMS: dict[str, tuple[str, ...]] = {
    "storage": (),  # bytes made durable: knows no shard
    "ranks": (),  # the rank's environment and collectives: the bottom of the training side
    "format": ("storage",),  # the shard file and the checkpoint directory
    "ipc": ("format", "storage", "ranks"),  # the shared-memory files of rank and agent
    "dcp": ("format", "storage", "ipc", "ranks"),  # the torch.distributed.checkpoint plug-in
}


def test_the_elastic_rooms_stand_below_the_facade() -> None:
    """A room imports its own modules and the rooms below it, never the facade's level, dcp or integrations."""
    offenders = set()
    for room, below in ELASTIC_ROOMS.items():
        allowed = tuple(f"launchers.elastic.{r}." for r in (room, *below))
        offenders |= {
            edge
            for edge in layer_offenders(f"launchers.elastic.{room}", ("launchers.elastic",))
            if not edge.partition(" → ")[2].startswith(allowed)
        }
    assert not offenders, sorted(offenders)


def test_the_elastic_rooms_import_nothing_on_entry() -> None:
    """mlaunch imports ``ipc.staging`` on every start and ``dcp`` costs torch.distributed.checkpoint:
    a room's ``__init__`` loads none of its modules, so an importer pays for the module it names alone."""
    graph = import_graph()
    eager = {room: sorted(graph[f"launchers.elastic.{room}"]) for room in ELASTIC_ROOMS}
    assert not any(eager.values()), eager


def imports_from_outside(package: str) -> dict[str, str]:
    """``a → b`` for every import of a module of ``package`` by a module outside it, with ``b`` itself."""
    inside = (package, package + ".")
    return {
        f"{name} → {target}": target
        for name, targets in import_graph().items()
        if not name.startswith(inside)
        for target in targets
        if target.startswith(inside)
    }


def test_nothing_depends_on_a_trainer_integration() -> None:
    """The integrations adapt one trainer each (and import it): no other module of the project imports them."""
    assert not imports_from_outside("launchers.elastic.integrations")


def test_the_launcher_reads_the_training_sides_formats_and_runs_none_of_its_code() -> None:
    """mlaunch shares the formats and the shared-memory protocol with the ranks (format, storage, ipc,
    ranks' env) and computes replica groups (``replicas``); the Checkpointer, the guard, DCP and the
    trainer integrations run only in a training script."""
    shared = tuple(f"launchers.elastic.{room}." for room in ("format", "storage", "ipc", "ranks"))
    offenders = {
        edge
        for edge, target in imports_from_outside("launchers.elastic").items()
        if not target.startswith(shared) and target != "launchers.elastic.replicas"
    }
    assert not offenders, sorted(offenders)
