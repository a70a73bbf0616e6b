"""The shapes of synthetic click logs: columns, cardinalities, missing rates, click effects.

Numbers here are read off real data: the Criteo 1TB per-feature table sizes (scaled down, see
:func:`default_cardinality`), and the missing rates, medians and 90th percentiles of the
first 8,000 lines of Criteo Kaggle ``train.txt`` and the first 9,000 of Avazu ``train.csv``.
They describe distributions only; no row of real data is stored.

Example:
    >>> spec = format_spec("criteo")
    >>> [f.name for f in spec.sparse][:3]
    ['C1', 'C2', 'C3']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ctrctl.errors import ConfigError

FORMATS = ("criteo", "avazu")

#: Criteo 1TB per-feature vocabulary sizes (C1..C26, contiguous ids, not capped).
CRITEO_1TB_SIZES = (
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10,
    2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35,
)
#: Avazu (40M rows, 10 days) per-feature vocabulary sizes.
AVAZU_SIZES = {
    "C1": 7, "banner_pos": 7, "site_id": 4737, "site_domain": 7745, "site_category": 26,
    "app_id": 8552, "app_domain": 559, "app_category": 36, "device_id": 2686408,
    "device_ip": 6729486, "device_model": 8251, "device_type": 5, "device_conn_type": 4,
    "C14": 2626, "C15": 8, "C16": 9, "C17": 435, "C18": 4, "C19": 68, "C20": 172, "C21": 60,
}

#: Effects are drawn for the most frequent ranks only: rarer values carry no signal, so a
#: model that sees each frequent value a few times can approach the best AUC.
EFFECT_HEAD = 100


def default_cardinality(full_size: int) -> int:
    """A real vocabulary size, scaled for generated data: sizes of a million or more / 10.

    This keeps the spread of real logs (3 values to ~5 million) while the largest tables
    stay small enough to train on one machine.
    """
    return full_size if full_size < 1_000_000 else full_size // 10


def zipf_exponent(cardinality: int) -> float:
    """Zipf exponent of a feature: steeper for small vocabularies (a few values dominate),
    flatter for large ones (a long tail), as in real click logs."""
    return 1.2 if cardinality <= 1000 else 1.1


@dataclass(frozen=True)
class SparseSpec:
    """A categorical column.

    Attributes:
        name: column name.
        cardinality: number of distinct values; ids are Zipf ranks in ``[0, cardinality)``.
        exponent: Zipf exponent of the rank distribution.
        effect: std of the per-value click effects (logit units); 0 means no effect.
        group: the missing group (see :class:`FormatSpec.groups`) or None.
        values: for integer-valued columns, the values of the most frequent ranks in order;
            None for hex-hashed columns. Ranks past the list take generated integers in
            ``value_range``.
        value_range: ``(low, high)`` of generated integer values.
    """

    name: str
    cardinality: int
    exponent: float = 1.1
    effect: float = 0.0
    group: str | None = None
    values: tuple[int, ...] | None = None
    value_range: tuple[int, int] | None = None

    @property
    def is_int(self) -> bool:
        return self.values is not None or self.value_range is not None


@dataclass(frozen=True)
class DenseSpec:
    """An integer count: ``floor(median * exp(sigma * z))`` with ``z ~ N(0, 1)`` (drawn
    from 65,536 equal-probability levels, so ``|z| <= 4.3``; see ``synthetic_model``).

    Attributes:
        median: the continuous median before flooring.
        sigma: log-scale spread (heavy right tail).
        effect: click effect per unit of ``z`` (logit units).
        group: missing group or None.
        negative_rate: share of rows with a small negative value (-1..-3), as Criteo's I2.
    """

    name: str
    median: float
    sigma: float
    effect: float = 0.0
    group: str | None = None
    negative_rate: float = 0.0


@dataclass(frozen=True)
class FormatSpec:
    """All columns of one log format and how rows go missing together.

    Attributes:
        groups: missing group -> rate. In Criteo a missing value is an empty field; in Avazu
            a "missing" value is a placeholder (the rank-0 value, e.g. the anonymous device).
        complements: group -> group it is the exact complement of (a row is in one of the two).
        interaction: two sparse columns whose frequent value pairs have their own effect,
            and its std.
        effect_scale: multiplies every effect; tuned so the best AUC lands near 0.78.
    """

    name: str
    dense: tuple[DenseSpec, ...]
    sparse: tuple[SparseSpec, ...]
    groups: dict[str, float] = field(default_factory=dict)
    interaction: tuple[str, str, float] | None = None
    complements: dict[str, str] = field(default_factory=dict)
    effect_scale: float = 1.0
    target_label_rate: float = 0.225

    def with_cardinalities(self, cardinalities: dict[str, int] | None) -> FormatSpec:
        """A copy with some sparse cardinalities replaced (e.g. smaller tables for tests)."""
        if not cardinalities:
            return self
        known = {f.name for f in self.sparse}
        unknown = sorted(set(cardinalities) - known)
        if unknown:
            raise ConfigError(
                f"unknown sparse feature(s) {', '.join(unknown)} in cardinalities",
                where=f"format {self.name}",
                hint=f"use names among {', '.join(f.name for f in self.sparse)}",
            )
        for name, size in cardinalities.items():
            if not isinstance(size, int) or size < 1:
                raise ConfigError(
                    f"cardinality of {name} must be a positive integer, got {size!r}",
                    hint="e.g. --cardinality C3=100000",
                )
        sparse = tuple(
            SparseSpec(**{**f.__dict__, "cardinality": cardinalities.get(f.name, f.cardinality)})
            for f in self.sparse
        )
        return FormatSpec(**{**self.__dict__, "sparse": sparse})

    def cardinalities(self) -> dict[str, int]:
        return {f.name: f.cardinality for f in self.sparse}


def _criteo() -> FormatSpec:
    # Missing groups: columns that go missing together in the real sample, with its rates.
    groups = {
        "i1": 0.451, "i12": 0.774, "i3": 0.201, "i6": 0.252, "i5": 0.049, "i8": 0.001,
        "c3": 0.033, "c19": 0.453, "c6": 0.133, "c22": 0.819,
    }
    dense = (
        DenseSpec("I1", 1.5, 1.3, effect=0.30, group="i1"),
        DenseSpec("I2", 3.5, 3.1, negative_rate=0.10),
        DenseSpec("I3", 7.5, 1.5, group="i3"),
        DenseSpec("I4", 4.5, 1.2, group="i3"),
        DenseSpec("I5", 2800.0, 1.9, group="i5"),
        DenseSpec("I6", 41.0, 1.65, effect=-0.20, group="i6"),
        DenseSpec("I7", 3.5, 1.6, group="i5"),
        DenseSpec("I8", 7.5, 1.2, group="i8"),
        DenseSpec("I9", 42.0, 1.55, group="i5"),
        DenseSpec("I10", 0.6, 0.95, group="i1"),
        DenseSpec("I11", 1.5, 1.0, effect=0.25, group="i5"),
        DenseSpec("I12", 0.4, 1.6, group="i12"),
        DenseSpec("I13", 5.5, 1.2, effect=-0.20, group="i3"),
    )
    # Which features carry a click effect, and how strong (std of the per-value effects).
    effects = {
        "C1": 0.4, "C2": 0.4, "C3": 0.5, "C5": 0.5, "C6": 0.4, "C8": 0.3, "C9": 0.5,
        "C11": 0.4, "C13": 0.3, "C14": 0.5, "C15": 0.3, "C17": 0.4, "C19": 0.3, "C20": 0.4,
        "C23": 0.5, "C25": 0.4, "C26": 0.3,
    }
    sparse_groups = {
        "C3": "c3", "C4": "c3", "C12": "c3", "C16": "c3", "C21": "c3", "C24": "c3",
        "C19": "c19", "C20": "c19", "C25": "c19", "C26": "c19", "C6": "c6", "C22": "c22",
    }
    sparse = []
    for i, full in enumerate(CRITEO_1TB_SIZES, start=1):
        name = f"C{i}"
        size = default_cardinality(full)
        sparse.append(
            SparseSpec(
                name,
                size,
                exponent=zipf_exponent(size),
                effect=effects.get(name, 0.0),
                group=sparse_groups.get(name),
            )
        )
    return FormatSpec(
        "criteo", dense, tuple(sparse), groups, interaction=("C14", "C23", 0.4),
        effect_scale=0.9,
    )


#: Avazu columns in file order; "int" columns print integers, the rest 8-hex-digit hashes.
AVAZU_COLUMNS = (
    "id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category",
    "app_id", "app_domain", "app_category", "device_id", "device_ip", "device_model",
    "device_type", "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
)


def _avazu() -> FormatSpec:
    # "app" rows carry placeholder site_* values and "site" rows placeholder app_* values, as
    # in the real logs (each impression is on a site or in an app); most devices are anonymous.
    groups = {"site": 0.22, "app": 0.78, "device": 0.87, "c20": 0.62}
    complements = {"app": "site"}
    effects = {
        "C1": 0.3, "banner_pos": 0.4, "site_id": 0.5, "site_category": 0.4, "app_id": 0.5,
        "app_category": 0.3, "device_model": 0.3, "device_conn_type": 0.3, "C14": 0.5,
        "C16": 0.3, "C17": 0.4, "C18": 0.3, "C19": 0.3, "C20": 0.3, "C21": 0.4,
    }
    ints: dict[str, tuple[tuple[int, ...] | None, tuple[int, int] | None]] = {
        "C1": ((1005, 1002, 1010, 1012, 1007, 1001, 1008), None),
        "banner_pos": ((0, 1, 7, 2, 4, 5, 3), None),
        "device_type": ((1, 0, 4, 5, 2), None),
        "device_conn_type": ((0, 2, 3, 5), None),
        "C14": (None, (375, 24052)),
        "C15": ((320, 300, 216, 728, 120, 1024, 480, 768), None),
        "C16": ((50, 250, 36, 480, 90, 20, 320, 768, 1024), None),
        "C17": (None, (112, 2758)),
        "C18": ((0, 3, 2, 1), None),
        "C19": (None, (33, 1959)),
        "C20": ((-1,), (100000, 100248)),
        "C21": (None, (1, 255)),
    }
    sparse_groups = {
        "site_id": "site", "site_domain": "site", "site_category": "site",
        "app_id": "app", "app_domain": "app", "app_category": "app",
        "device_id": "device", "C20": "c20",
    }
    sparse = []
    for name, full in AVAZU_SIZES.items():
        size = default_cardinality(full)
        values, value_range = ints.get(name, (None, None))
        sparse.append(
            SparseSpec(
                name,
                size,
                exponent=zipf_exponent(size),
                effect=effects.get(name, 0.0),
                group=sparse_groups.get(name),
                values=values,
                value_range=value_range,
            )
        )
    return FormatSpec(
        "avazu", (), tuple(sparse), groups, interaction=("banner_pos", "C14", 0.4),
        complements=complements,
        effect_scale=0.9, target_label_rate=0.17,
    )


def format_spec(name: str) -> FormatSpec:
    """The column spec of a log format: ``criteo`` or ``avazu``."""
    if name == "criteo":
        return _criteo()
    if name == "avazu":
        return _avazu()
    raise ConfigError(f"unknown log format {name!r}", hint=f"use one of {', '.join(FORMATS)}")
