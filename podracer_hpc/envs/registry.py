"""The task registry: every task declares its options, their validation and how to build its env.

A task lives in one module next to its env code and ends with a :func:`register` call::

    @dataclass
    class TradingOptions:                      # the settings of section env.trading
        cost: float = F(0.001, "proportional transaction cost of a buy or a sell")
        ...
        def check(self) -> None:               # optional: raise OptionError(field, why)
            if not 0 <= self.cost < 1:
                raise OptionError("cost", f"must be in [0, 1), got {self.cost}")

    register(Task("stock_trading", build=StockTradingEnv, options=TradingOptions, section="trading"))

and the module's dotted path is one line of :data:`TASK_MODULES` (docs/adding-a-task.md). A task
of another package needs no line here: that package names its module in the entry-point group
:data:`ENTRY_POINT_GROUP` (``podracer_hpc.tasks``) of its metadata, and the registry imports it
after the built-in ones (a plugin that fails to load is reported on stderr, and named when its
task is asked for). The registry imports those modules the first time it is read (so importing
it, or :mod:`podracer_hpc.config`, never imports torch); a module imported some other way
registers its tasks then.

The config (:mod:`podracer_hpc.config`) asks the registry for the option sections
(:func:`sections`): each becomes the key ``env.<section>`` with the dataclass's fields, their
defaults and one-line docs; ``load_config`` runs each section's ``check``. A pod builds its env
with :func:`build_env` from the ``env`` section. Tasks of one family (the MuJoCo tasks) share a
section. This module imports only the standard library: the arrows point from the task
modules to it, never back.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

# The modules that declare the built-in tasks, one line each (imported on first use, in this
# order; the order of the config's option sections follows it).
TASK_MODULES: list[str] = [
    "podracer_hpc.envs.classic_tasks",
    "podracer_hpc.trading.task",
    "podracer_hpc.envs.mujoco_tasks",
    "podracer_hpc.envs.gym_task",
    "podracer_hpc.envs.jax_task",
]
# Where other packages declare their task modules (pyproject.toml:
# [project.entry-points."podracer_hpc.tasks"] my_task = "my_package.my_task"), loaded after TASK_MODULES.
ENTRY_POINT_GROUP = "podracer_hpc.tasks"


class Lazy:
    """A task's env class named, not imported: ``Lazy("podracer_hpc.envs.pendulum", "Pendulum")``
    (``key``: an item of that attribute, e.g. one class of a dict of them). It is imported when a
    pod first builds the env, so that declaring a task (and reading the config) imports no torch."""

    def __init__(self, module: str, attr: str, key: str | None = None):
        self.module, self.attr, self.key = module, attr, key

    def resolve(self) -> Callable[..., Any]:
        """The env class (or builder) it names, imported now."""
        obj = getattr(importlib.import_module(self.module), self.attr)
        return obj[self.key] if self.key is not None else obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lazy) and (self.module, self.attr, self.key) == (other.module, other.attr, other.key)

    def __hash__(self) -> int:
        return hash((self.module, self.attr, self.key))

    def __repr__(self) -> str:
        return f"Lazy({self.module}:{self.attr}{'' if self.key is None else f'[{self.key!r}]'})"


class OptionError(ValueError):
    """A task option has a bad value: ``key`` is the option's field name, ``why`` says what is allowed."""

    def __init__(self, key: str, why: str):
        super().__init__(f"{key}: {why}")
        self.key, self.why = key, why


@dataclass(frozen=True)
class Task:
    """One task of the registry.

    ``build(num_envs, device=..., seed=..., max_episode_steps=..., dtype=..., **options)`` returns
    its batched env (a VecEnv class is such a callable); ``options`` is the dataclass of its
    settings (every field an ``F(default, doc)``; an optional ``check()`` method raises
    :class:`OptionError`), kept in the config section ``env.<section>``, which tasks of one
    family share. A task without settings leaves ``options`` None. ``assets``: its env's
    observation repeats the same features per asset and says where (``asset_layout()``);
    ``discrete``: its actions are choices (SAC and TD3 pods refuse it before anything runs).
    ``verify(env_section, algo)``: the checks the config runs only when this task is ``env.name``
    and that need more than the options (the ``gymnasium`` task makes its env once to see its
    spaces); it raises the config's ConfigError naming the key. ``names_code(options)``: the
    option values that name code to import or call (the ``jax`` task's factory and its keyword
    arguments; a gymnasium id's ``module:`` part), ``{field: value}``, empty when none: ``podracer
    evaluate`` and ``export`` build such an env from a stored config only when the user trusts it
    (:func:`code_named`; docs/security.md). A task whose options name code must declare it.
    """

    name: str
    build: Callable[..., Any]
    options: type | None = None
    section: str = ""
    doc: str = ""
    assets: bool = False  # its env has asset_layout(): agent.network per_asset works on it
    discrete: bool = False  # its actions are choices, not torques (agent.algo sac and td3 need continuous ones)
    verify: Callable[[Any, str], None] | None = None  # checks that need the env itself (run when it is env.name)
    names_code: Callable[[Any], dict[str, Any]] | None = None  # option values that name code to import or call

    @property
    def builder(self) -> Callable[..., Any]:
        """``build`` itself, or the class a :class:`Lazy` names (imported now)."""
        return self.build.resolve() if isinstance(self.build, Lazy) else self.build


_TASKS: dict[str, Task] = {}
_DECLARED_IN: dict[str, str] = {}  # task name -> the module whose register() call declared it (the order of names())
_PLUGIN_ERRORS: dict[str, str] = {}  # entry point name -> why it did not load
_PLUGIN_TASKS: set[str] = set()  # the names registered while a plugin loaded (they sort after the built-in ones)
_plugins_loaded = False


def _load() -> None:
    """Import the modules of :data:`TASK_MODULES` (they register their tasks; a module imported
    already costs a dictionary look-up, one still being imported registers when it ends), then,
    once per process, the task plugins of other packages (:func:`load_plugins`)."""
    for module in list(TASK_MODULES):
        importlib.import_module(module)
    if not _plugins_loaded:
        load_plugins()


def _tasks_of(obj: Any) -> list[Task]:
    """The tasks an entry point's object declares: a module registered its own at import; a Task,
    a list of them, or a function returning either (or None, having registered them itself)."""
    if isinstance(obj, types.ModuleType):
        return []
    if isinstance(obj, Task):
        return [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(t, Task) for t in obj):
        return list(obj)
    if callable(obj) and not isinstance(obj, type):
        out = obj()
        return [] if out is None else _tasks_of(out)
    raise TypeError(f"expected a module, a Task, a list of Tasks or a function returning them, got {obj!r}")


def load_plugins() -> dict[str, str]:
    """Import the task modules that installed packages declare in :data:`ENTRY_POINT_GROUP` (once per
    process; by entry-point name). One that fails is skipped and reported on stderr, and
    :func:`get` names it; returns ``{entry point: why it failed}``."""
    global _plugins_loaded
    _plugins_loaded = True  # first: a plugin that reads the registry at import does not recurse
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        dist = getattr(getattr(ep, "dist", None), "name", "?")
        before = set(_TASKS)
        try:
            for task in _tasks_of(ep.load()):
                register(task)
        except Exception as e:  # a broken plugin must not break every other task
            _PLUGIN_ERRORS[ep.name] = f"{ep.value} (package {dist}): {type(e).__name__}: {e}"
            print(
                f"podracer: the task plugin {ep.name!r} ({_PLUGIN_ERRORS[ep.name]}) did not load; "
                "its tasks are missing",
                file=sys.stderr,
            )
        _PLUGIN_TASKS.update(set(_TASKS) - before)
    return dict(_PLUGIN_ERRORS)


def register(task: Task) -> Task:
    """Add ``task`` to the registry (a task module calls this once per task, at import).

    Raises ValueError for a name already taken by another task, a section without an options
    class or one that another options class already owns, and options fields without a doc.
    """
    if not task.name or not task.name.replace("_", "").isalnum() or task.name != task.name.lower():
        raise ValueError(f"task name {task.name!r}: use lower-case letters, digits and '_'")
    old = _TASKS.get(task.name)
    if old is not None and old != task:
        raise ValueError(
            f"task {task.name!r} is already registered (by {_DECLARED_IN.get(task.name, '?')}); "
            "choose another name or unregister it first"
        )
    if (task.options is None) != (not task.section):
        raise ValueError(
            f"task {task.name!r}: options and section go together (options {task.options}, section {task.section!r})"
        )
    if task.options is not None:
        if not (isinstance(task.options, type) and dataclasses.is_dataclass(task.options)):
            raise ValueError(f"task {task.name!r}: options must be a dataclass, got {task.options!r}")
        if not task.section.isidentifier() or task.section != task.section.lower():
            raise ValueError(f"task {task.name!r}: section {task.section!r} must be a lower-case identifier")
        for f in dataclasses.fields(task.options):
            doc = f.metadata.get("doc", "")
            if not doc.strip() or "\n" in doc:
                raise ValueError(f"{task.options.__name__}.{f.name}: declare it with F(default, 'a one-line doc')")
        for other in _TASKS.values():
            if other.section == task.section and other.options is not task.options:
                raise ValueError(
                    f"task {task.name!r}: section env.{task.section} belongs to {other.options.__name__} "
                    f"(task {other.name!r}); choose another section"
                )
    _TASKS[task.name] = task
    _DECLARED_IN.setdefault(task.name, sys._getframe(1).f_globals.get("__name__", ""))  # the declaring module
    return task


def unregister(name: str) -> None:
    """Remove task ``name`` (tests that add a task take it out again)."""
    _TASKS.pop(name, None)
    _DECLARED_IN.pop(name, None)
    _PLUGIN_TASKS.discard(name)


def get(name: str) -> Task:
    """The task called ``name``; ValueError listing the known tasks otherwise."""
    _load()
    try:
        return _TASKS[name]
    except KeyError:
        broken = "".join(f"; task plugin {k!r} did not load: {v}" for k, v in sorted(_PLUGIN_ERRORS.items()))
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_TASKS))}{broken}") from None


def _ordered() -> list[Task]:
    """The tasks in the order of their modules in :data:`TASK_MODULES` (then the plugins' and the
    others, as registered), whatever order the modules were imported in."""
    _load()
    rank = {m: i for i, m in enumerate(TASK_MODULES)}
    last = len(rank)  # a plugin's tasks, and those registered some other way, in the order they came
    return sorted(
        _TASKS.values(), key=lambda t: last if t.name in _PLUGIN_TASKS else rank.get(_DECLARED_IN.get(t.name, ""), last)
    )


def names() -> list[str]:
    """Every registered task name (built-in tasks in the order of :data:`TASK_MODULES`)."""
    return [t.name for t in _ordered()]


def sections() -> dict[str, type]:
    """The option sections of every task: ``{section: options dataclass}``, in the order of :func:`names`."""
    out: dict[str, type] = {}
    for t in _ordered():
        if t.options is not None:
            out.setdefault(t.section, t.options)
    return out


def check(options: Any) -> None:
    """Run the validation of an options instance (its ``check()``, if it has one).

    Raises :class:`OptionError` naming the field.
    """
    fn = getattr(options, "check", None)
    if fn is not None:
        fn()


def verify(env: Any, algo: str = "ppo") -> None:
    """Run the ``verify`` checks of task ``env.name`` (:class:`Task`) on the ``env`` config section."""
    task = get(env.name)
    if task.verify is not None:
        task.verify(env, algo)


def options_from(cls: type, values: Mapping[str, Any], owner: str, ignore_unknown: bool = False) -> Any:
    """An instance of options dataclass ``cls`` from keyword ``values`` (defaults for the rest), checked.

    Unknown names raise TypeError listing the valid ones (or are dropped with ``ignore_unknown``,
    for settings read back from an older checkpoint); bad values raise ValueError
    ``"<owner>: <field>: <why>"``.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown and not ignore_unknown:
        raise TypeError(f"{owner}: unknown option(s) {', '.join(unknown)}; options: {', '.join(sorted(known))}")
    opts = cls(**{k: v for k, v in values.items() if k in known})
    try:
        check(opts)
    except OptionError as e:
        raise ValueError(f"{owner}: {e}") from None
    return opts


def as_kwargs(options: Any) -> dict[str, Any]:
    """The fields of an options instance as keyword options of its env (lists copied)."""
    if options is None:
        return {}
    return {
        f.name: (list(v) if isinstance(v := getattr(options, f.name), list) else v) for f in dataclasses.fields(options)
    }


def option_rows(cls: type) -> list[tuple[str, Any, Any, str]]:
    """``(name, type, default, doc)`` of every field of an options dataclass."""
    hints = typing.get_type_hints(cls)
    return [
        (
            f.name,
            hints[f.name],
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
            f.metadata.get("doc", ""),
        )
        for f in dataclasses.fields(cls)
    ]


def options_of(env: Any) -> Any:
    """The options instance of the task named by ``env.name`` (its section of the ``env`` config), or None."""
    task = get(env.name)
    if task.options is None:
        return None
    opts = getattr(env, task.section, None)
    if opts is None:
        opts = task.options()
    if not isinstance(opts, task.options):
        raise TypeError(f"env.{task.section}: expected {task.options.__name__}, got {type(opts).__name__}")
    return opts


def code_named(env: Any) -> dict[str, Any]:
    """The option values of the ``env`` config section that name code to import or call
    (:class:`Task` ``names_code``), as ``{"env.<section>.<field>": value}``; empty when its task names none."""
    task = get(env.name)
    opts = options_of(env)
    if task.names_code is None or opts is None:
        return {}
    return {f"env.{task.section}.{k}": v for k, v in task.names_code(opts).items()}


def build_env(env: Any, num_envs: int, device: Any = "cpu", seed: int = 0) -> Any:
    """The batched env of the config section ``env`` (``name``, ``max_episode_steps`` and the task's
    option section), ``num_envs`` wide on ``device``. The options are checked first."""
    task = get(env.name)
    opts = options_of(env)
    if opts is not None:
        try:
            check(opts)
        except OptionError as e:
            raise ValueError(f"env.{task.section}.{e}") from None
    return task.build(num_envs, device=device, seed=seed, max_episode_steps=env.max_episode_steps, **as_kwargs(opts))


class TaskTable(Mapping):
    """A live read-only view ``{name: build}`` of the registry (``podracer_hpc.envs.TASKS``)."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        _load()
        return _TASKS[name].builder

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(names())

    def __repr__(self) -> str:
        return f"TaskTable({', '.join(names())})"


__all__ = [
    "TASK_MODULES",
    "ENTRY_POINT_GROUP",
    "OptionError",
    "Task",
    "register",
    "unregister",
    "load_plugins",
    "get",
    "names",
    "sections",
    "check",
    "verify",
    "options_from",
    "as_kwargs",
    "option_rows",
    "options_of",
    "code_named",
    "build_env",
    "TaskTable",
]
