"""Run configuration: TOML files under configs/ (shipped as package data), plus `--set key=value`.

A config has one table per probe plan and one `[inputs]` table whose keys are the op's parameters
(its constants: widths, table rows, dtype, eps). Files are layered, later winning key by key:

1. `configs/plans/<plans>.toml`: the probe plans shared by every op of a size set (`token`,
   `timestep`, `sinusoid`, `quick`); `<plans>` is the file's `plans = "..."` or the op's `plan_set`;
2. `configs/<op>/default.toml`: the op's `[inputs]` (and its `plans`);
3. the plan's own file (`configs/<op>/quick.toml` for the quick plan), then a user's `--config FILE`;
4. `--set` overrides: `--set hidden=8` finds the key in whichever table holds it (it must be unique);
   `--set sweep.rows=64` names the table. Values are TOML literals (`[3, 4]`, `true`, `"float16"`; a
   bare word is a string) and must have the type of the key they replace.

A user's op (harness/ops/declared.py) has no TOML file of its own: its plans (the plan set, file or
tables it declares; by default `token`, and `quick` for the quick plan) with its constants' declared
defaults as `[inputs]`, then `--config FILE` and `--set` as above.

A file may set the plan itself: a top-level `quick = true` (the quick plan) or `quick = false` (the full
plan), as the shipped quick.toml files do and the evidence file records it.

The plan records have no defaults of their own: every number comes from a file, so no op's numbers
hide in the code.
"""
from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional

from h3bench.harness.ops import get_op
from h3bench.harness.ops.declared import DeclaredOp
from h3bench.harness.probes import registry


class ConfigError(ValueError):
    pass


def require(condition: bool, message: str) -> None:
    """Plan values are checked when the config is built: a bad value is the config's error, never a
    failed row blamed on the implementation under test."""
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class AllRowsPlan:
    batch_sizes: tuple[int, ...]
    seeds: tuple[int, ...]

    def __post_init__(self):
        require(bool(self.batch_sizes) and min(self.batch_sizes) >= 1, "batch_sizes must be >= 1, at least one")
        require(bool(self.seeds), "seeds must not be empty")


@dataclass(frozen=True)
class SubBatchPlan:
    full_batch: int
    seeds: tuple[int, ...]
    sub_batch_sizes: tuple[int, ...]
    # sizes below `dense_from` start every max(size, full_batch // spread) rows, larger ones tile
    dense_from: int
    spread: int

    def __post_init__(self):
        require(self.full_batch >= 1, "full_batch must be >= 1")
        require(bool(self.sub_batch_sizes) and min(self.sub_batch_sizes) >= 1,
                 "sub_batch_sizes must be >= 1, at least one")
        require(max(self.sub_batch_sizes, default=0) <= self.full_batch, "sub_batch_sizes must be <= full_batch")
        require(bool(self.seeds), "seeds must not be empty")
        require(self.spread >= 1, "spread must be >= 1")

    def step(self, size: int) -> int:
        return size if size >= self.dense_from else max(size, self.full_batch // self.spread)

    def starts(self, size: int) -> range:
        return range(0, self.full_batch, self.step(size))


@dataclass(frozen=True)
class SweepPlan:
    rows: int
    seeds: tuple[int, ...]
    small_sizes: int       # batch sizes 1..small_sizes
    first_power: int       # then k-1, k, k+1 for k = first_power, 2*first_power, ... <= rows
    probe_spread: int      # probe rows n//8 + 3 + j*(n//8) for j < probe_spread, plus 0 and n-1
    max_failures: int

    def __post_init__(self):
        require(self.rows >= 1, "rows must be >= 1")
        require(bool(self.seeds), "seeds must not be empty")
        require(self.first_power >= 2, "first_power must be >= 2")

    def batch_sizes(self) -> list[int]:
        sizes = set(range(1, min(self.small_sizes, self.rows) + 1))  # a batch holds at most `rows` rows
        k = self.first_power
        while k <= self.rows:
            sizes.update(s for s in (k - 1, k, k + 1) if 1 <= s <= self.rows)
            k *= 2
        sizes.add(self.rows)
        return sorted(sizes)

    def probe_rows(self) -> list[int]:
        n, eighth = self.rows, self.rows // 8
        rows = {0, n - 1} | {eighth + 3 + j * eighth for j in range(self.probe_spread)}
        return sorted(r for r in rows if 0 <= r < n)

    @staticmethod
    def positions(size: int) -> list[int]:
        return sorted({0, (size - 1) // 2, size - 1})


@dataclass(frozen=True)
class AccuracyPlan:
    rows: tuple[int, ...]
    input_seed: int
    grad_seed: int

    def __post_init__(self):
        require(bool(self.rows) and min(self.rows) >= 1, "rows must be >= 1, at least one")


@dataclass(frozen=True)
class TimingPlan:
    warmup: int
    reps: int       # samples per figure and repeat
    repeats: int    # time everything twice: a difference smaller than the spread is noise
    block: int      # samples a row takes per turn when rows are interleaved (harness/timing.py)
    # zero a 256 MiB buffer before each synchronized and graph sample (a cold L2); off as in the prior art, so plan
    # files written before the switch existed still load
    flush_l2: bool = False
    # also time each figure's step as a CUDA-graph replay (*_graph_us) where the device has graphs (CUDA). The
    # shipped plans set it (configs/plans/*.toml, `--no-graph-timing` clears it); False for a plan file
    # without the key, so plan files written before the switch existed still load as they were measured.
    graph: bool = False

    def __post_init__(self):
        require(self.reps >= 1 and self.repeats >= 1 and self.block >= 1, "reps, repeats and block must be >= 1")


@dataclass(frozen=True)
class CompilePlan:
    """Seconds a torch.compile row's compilations may take together, by its mode (adapters/_torch_compile.py):
    what keeps a run bounded, and enough for the compilations whose verdict the row stands for
    (docs/decisions.md, "torch.compile rows")."""
    default_budget_s: float
    max_autotune_budget_s: float

    def __post_init__(self):
        require(self.default_budget_s > 0 and self.max_autotune_budget_s > 0, "budgets must be positive seconds")

    def budget_s(self, mode: str) -> float:
        """The budget of a compile `mode` as torch.compile names it (`max-autotune...` or the default)."""
        return self.max_autotune_budget_s if mode.startswith("max-autotune") else self.default_budget_s


@dataclass(frozen=True)
class RunConfig:
    op: str
    inputs: Any
    all_rows: AllRowsPlan
    full_vs_sub: SubBatchPlan
    sweep: SweepPlan
    accuracy: AccuracyPlan
    timing: TimingPlan
    quick: bool = False
    plans: str = ""
    # the plans of h3bench's probes beyond the RFC's (harness/probes/registry.py), by table, in the registry's
    # order; a config without a probe's table (an older one) leaves the probe out
    beyond_rfc: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # the torch.compile rows' budgets (`[compile]`); None: a plan without the table, the rows' own defaults
    compile: Optional[CompilePlan] = None

    def plan(self, table: str) -> Optional[Any]:
        """The plan record of `table`: one of PLAN_TABLES (always set), or a probe's beyond the RFC's (None: the
        config does not have it)."""
        return getattr(self, table) if table in PLAN_TABLES else self.beyond_rfc.get(table)

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "quick": self.quick, "plans": self.plans, "inputs": _plain(self.inputs),
                **{table: _plain(getattr(self, table)) for table in PLAN_TABLES},
                **{table: _plain(plan) for table, plan in self.beyond_rfc.items()},
                **({COMPILE_TABLE: _plain(self.compile)} if self.compile is not None else {})}


def _plain(obj: Any) -> Any:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(obj).items()}


# the tables every config has: the RFC's probes', accuracy's and the timing's (RunConfig's fields)
PLAN_TABLES = ("all_rows", "full_vs_sub", "sweep", "accuracy", "timing")
# a table a config may have beside them that is no probe's
COMPILE_TABLE = "compile"


def plan_types() -> dict[str, type]:
    """Every plan table a config may have, with its record: PLAN_TABLES, then each table of a probe beyond the
    RFC's, in PROBES' order (harness/probes/registry.py)."""
    types = {"timing": TimingPlan, **{spec.plan_table: spec.plan_type for spec in registry.probes()}}
    return {**{table: types[table] for table in PLAN_TABLES}, **types}


CONFIG_PACKAGE = "h3bench.configs"


def _config_file(*parts: str) -> Path:
    return Path(str(resources.files(CONFIG_PACKAGE).joinpath(*parts)))


def builtin_config_path(op: str, quick: bool) -> Path:
    """configs/<op>/default.toml or quick.toml; an op registered from elsewhere may name its own folder
    (`config_dir`)."""
    name = "quick.toml" if quick else "default.toml"
    folder = getattr(get_op(op), "config_dir", None)
    path = Path(folder) / name if folder else _config_file(op, name)
    if not path.is_file():
        raise ConfigError(f"no built-in {'quick ' if quick else ''}config for op {op!r} ({path})")
    return path


def plans_path(name: str) -> Path:
    path = _config_file("plans", f"{name}.toml")
    if not path.is_file():
        known = sorted(p.stem for p in _config_file("plans").glob("*.toml"))
        raise ConfigError(f"unknown plan set {name!r}; known: {', '.join(known)}")
    return path


def load_plans(name: str) -> dict[str, Any]:
    """The probe plan records of the built-in plan set `name` alone, by table (`all_rows`, `full_vs_sub`,
    ...): for a caller that brings its own inputs instead of an op's `[inputs]` (h3bench.testing)."""
    data, types = _read_toml(plans_path(name)), plan_types()
    return {table: _build(types[table], values, table) for table, values in data.items() if table in types}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def _layer(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, table by table and key by key."""
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in base.items()}
    for name, values in top.items():
        if isinstance(values, dict) and isinstance(out.get(name), dict):
            out[name].update(values)
        else:
            out[name] = values
    return out


# A config file's top-level key that sets the plan: true for the quick plan, false for the full plan.
PLAN_KEY = "quick"


def plan_key(data: dict[str, Any], source: Any) -> Optional[bool]:
    """The plan a config file's table `data` sets (its top-level `quick`, taken out of `data`): True for the
    quick plan, False for the full plan, None where it sets none."""
    if PLAN_KEY not in data:
        return None
    value = data.pop(PLAN_KEY)
    if not isinstance(value, bool):
        raise ConfigError(f"{source}: {PLAN_KEY} must be true (the quick plan) or false (the full plan), "
                          f"got {value!r}")
    return value


def file_plan(path: Path) -> Optional[bool]:
    """The plan the config file at `path` sets (`quick = true` or `false`), None where it sets none."""
    return plan_key(_read_toml(path), path)


def _op_file(op: str, path: Path) -> tuple[dict[str, Any], Optional[bool]]:
    """A config file of `op` (its `op` key, if any, must name it): its tables and keys, and the plan it sets."""
    data = _read_toml(path)
    file_op = data.pop("op", op)
    if file_op != op:
        raise ConfigError(f"{path} is a config for op {file_op!r}, not {op!r}")
    return data, plan_key(data, path)


def load_config(op: str, path: Optional[Path] = None, quick: bool = False,
                overrides: tuple[str, ...] = ()) -> RunConfig:
    """`op`'s config for the quick (`quick`) or the full plan, unless the file at `path` sets the plan itself."""
    spec = get_op(op)  # an unknown op is named as such before any file is looked for
    if isinstance(spec, DeclaredOp):
        return _declared_config(spec, path, quick, overrides)
    mine, file_quick = _op_file(op, path) if path is not None else ({}, None)
    quick = quick if file_quick is None else file_quick
    data = _layer(_op_file(op, builtin_config_path(op, quick=True))[0], mine) if quick else mine
    default, _ = _op_file(op, builtin_config_path(op, quick=False))
    plans = data.pop("plans", None) or default.pop("plans", None) or spec.plan_set
    default.pop("plans", None)
    source = path or builtin_config_path(op, quick)
    if not isinstance(plans, str):
        raise ConfigError(f"{source}: plans must be the name of a plan set, got {plans!r}")
    merged = _layer(_layer(_read_toml(plans_path(plans)), default), data)
    for item in overrides:
        apply_override(merged, item, op)
    return build_config(op, merged, quick, str(source), plans)


def _declared_config(op: DeclaredOp, path: Optional[Path], quick: bool, overrides: tuple[str, ...]) -> RunConfig:
    """A user op's config, with no TOML file of its own: its plans (the quick or the full plan it declares,
    by default the built-in `quick` and `token` sets), with its constants' declared defaults as `[inputs]`
    (the params record's defaults), then `--config FILE` (which may name other `plans`), then `--set`."""
    data, file_quick = _op_file(op.name, path) if path is not None else ({}, None)
    quick = quick if file_quick is None else file_quick
    chosen = data.pop("plans", None) or (op.declaration.quick_plans if quick else op.declaration.plans)
    label, tables = _plan_tables(chosen, op.base_dir)
    merged = _layer(tables, data)
    for item in overrides:
        apply_override(merged, item, op.name)
    return build_config(op.name, merged, quick, str(path) if path is not None else op.source, label)


def _plan_tables(source: Any, base_dir: Optional[Path]) -> tuple[str, dict[str, Any]]:
    """(the name recorded as the config's `plans`, the plan tables) of a user op's plan: a built-in plan
    set's name, a TOML file (a relative path is found beside the op's file), or the tables as a dict."""
    if isinstance(source, dict) or hasattr(source, "items"):
        return "the op's own plan tables", {k: dict(v) if hasattr(v, "items") else v for k, v in source.items()}
    text = str(source)
    if isinstance(source, Path) or text.endswith(".toml") or "/" in text:
        file = Path(text).expanduser()
        if not file.is_absolute() and base_dir is not None:
            file = base_dir / file
        return str(file), _read_toml(file)
    if not isinstance(source, str):
        raise ConfigError(f"plans must be a plan set's name, a TOML path or a dict of plan tables, got {source!r}")
    return text, _read_toml(plans_path(text))


def build_config(op_name: str, data: dict[str, Any], quick: bool, source: str, plans: str = "") -> RunConfig:
    tables = _tables(op_name)
    unknown = set(data) - set(tables)
    if unknown:
        raise ConfigError(f"{source}: unknown table(s) {sorted(unknown)}; known: {sorted(tables)}")
    built = {}
    for name, cls in tables.items():
        if name not in data and name not in ("inputs", *PLAN_TABLES):
            continue  # a probe beyond the RFC's without its table does not run
        values = data.get(name, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{name}] must be a table")
        built[name] = _build(cls, values, f"{name}")
    fields = {name: built.pop(name) for name in ("inputs", *PLAN_TABLES)}
    return RunConfig(op=op_name, quick=quick, plans=plans, **fields, compile=built.pop(COMPILE_TABLE, None),
                     beyond_rfc=built)


def _tables(op_name: str) -> dict[str, type]:
    """Every table of `op_name`'s config with its record: the op's `[inputs]`, then the plans."""
    return {"inputs": get_op(op_name).params_type, **plan_types(), COMPILE_TABLE: CompilePlan}


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"[{where}]: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"[{where}]: missing key(s) {missing}")
    kwargs = {key: _coerce(hints[key], value, f"{where}.{key}") for key, value in values.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ConfigError(f"[{where}]: {exc}") from None


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                  for v in value):
            raise ConfigError(f"{where}: expected a list of integers, got {value!r} (a TOML list: [64, 512]; "
                              f"on a command line quoted, e.g. --set '{where.strip('[]')}=[64, 512]')")
        if any(v < 0 for v in value):
            raise ConfigError(f"{where}: must not hold negative numbers, got {value!r}")
        return tuple(value)
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if hint is int and value < 0:
        raise ConfigError(f"{where}: must not be negative, got {value!r}")
    return value


def apply_override(data: dict[str, Any], item: str, op_name: str) -> None:
    key, sep, raw = item.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    value = _parse_value(raw)
    table, dot, name = key.rpartition(".")
    tables = _tables(op_name)
    if dot:
        if table not in tables:
            raise ConfigError(f"--set {item}: unknown table {table!r}; known: {sorted(tables)}")
        if name not in {f.name for f in dataclasses.fields(tables[table])}:
            raise ConfigError(f"--set {item}: table {table!r} has no key {name!r}")
    else:
        holders = [t for t, cls in tables.items() if name in {f.name for f in dataclasses.fields(cls)}]
        if not holders:
            every = sorted(f"{t}.{f.name}" for t, cls in tables.items() for f in dataclasses.fields(cls))
            raise ConfigError(f"--set {item}: unknown key {name!r}; known keys: {', '.join(every)}")
        if len(holders) > 1:
            raise ConfigError(f"--set {item}: {name!r} is in several tables ({', '.join(holders)}); "
                              f"write it as TABLE.{name}")
        table = holders[0]
    data.setdefault(table, {})[name] = value


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word, e.g. dtype=float16
