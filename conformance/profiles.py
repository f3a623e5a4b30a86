"""Hypothesis profiles of the suite, and how example counts scale per property.

- ``dev``: random, with the example database, for local runs;
- ``ci``: derandomized, no deadline, no database, ``print_blob`` (chosen when ``CI`` is set);
- ``nightly``: thousands of examples, random;
- ``mutation``: ``ci`` without shrinking, for the known-bad gate and the cosmic-ray runs
  (``strength/mutation/``), which need to know whether and how a run fails, not its smallest example.

On the CPU (the Triton interpreter runs one program after another in numpy) every
profile runs half of its examples and is loaded as ``<name>-cpu``; a test asks for a share
of the profile's count with :func:`examples`, so the profile, not the test, decides how long
a run takes.

A failing run must end soon: shrinking a failure is bounded by :data:`SHRINK_SECONDS` per
property (Hypothesis' own bound is five minutes, which under the interpreter it reaches), and
``--canary-no-shrink`` leaves shrinking out altogether, reporting the first failing example
as found. No profile but ``nightly`` runs Hypothesis' explain phase, which replays a failure
many times.

Every profile draws from the suite's strategies alone. Hypothesis also mixes in, now and then,
constants it harvests from the source of "local" modules (files outside ``site-packages`` and
outside test folders, among the modules imported so far); for the suite that pool would be the
suite's and the implementation's own source when it runs from a checkout, nothing when it is
installed, and more or less depending on which tests ran before. The same derandomized run
then drew other examples inside the repository than installed (seen: SGLang 0.5.23 failed two
properties inside and passed them installed), and a property rerun alone could draw others
than in the whole run. :func:`select` turns that harvest off.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture import engine as _engine

try:  # where Hypothesis 6.132 and later harvest local constants
    from hypothesis.internal.conjecture import providers as _providers
except ImportError:  # an older Hypothesis, which harvests none
    _providers = None

CPU_SCALE = 0.5

_COMMON = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# No explain phase: on the interpreter it can take minutes per failure, and the failing
# example with its labelled draws already tells the story.
_FAST_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]

settings.register_profile("dev", max_examples=100, deadline=None, phases=_FAST_PHASES, **_COMMON)
settings.register_profile(
    "ci",
    max_examples=200,
    phases=_FAST_PHASES,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    **_COMMON,
)
# Every phase, explain included, named here: a profile that names none inherits the loaded
# one's, and with CI set Hypothesis loads its ``ci`` profile (ours above) at import.
settings.register_profile(
    "nightly", max_examples=2000, deadline=None, phases=tuple(Phase), **_COMMON
)
# ``ci`` without shrinking: the same examples (derandomized, same counts), but a failure is
# reported as first found. The known-bad gate and the cosmic-ray runs (``strength/mutation/``) only
# need to know whether, and how, a run fails.
settings.register_profile(
    "mutation",
    max_examples=200,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
    derandomize=True,
    deadline=None,
    database=None,
    **_COMMON,
)

OWN_PROFILES = ("dev", "ci", "nightly", "mutation")

#: Seconds Hypothesis may spend shrinking the failures of one property, per profile; a
#: profile this suite does not define gets ``dev``'s. On the CPU (``<name>-cpu``) a property
#: gets CPU_SCALE of it, as it gets of the examples. The failing example reported when the
#: budget runs out is a real counterexample, only a less minimal one.
SHRINK_SECONDS = {"dev": 20, "ci": 20, "nightly": 120}


def shrink_seconds(name: str) -> int:
    """The shrink budget of loaded profile ``name`` (``ci-cpu``: half of ``ci``'s)."""
    base = name.removesuffix("-no-shrink")
    seconds = SHRINK_SECONDS.get(base.removesuffix("-cpu"), SHRINK_SECONDS["dev"])
    return max(1, int(seconds * CPU_SCALE)) if base.endswith("-cpu") else seconds


def select(name: str, *, on_cpu: bool, shrink: bool = True) -> str:
    """Load profile ``name``, scaled down when the device is the CPU and without the shrink
    phase when ``shrink`` is false; returns the name of what was loaded."""
    if on_cpu and name in OWN_PROFILES:
        parent = settings.get_profile(name)
        scaled = f"{name}-cpu"
        settings.register_profile(
            scaled, parent=parent, max_examples=max(1, int(parent.max_examples * CPU_SCALE))
        )
        name = scaled
    if not shrink:
        parent = settings.get_profile(name)
        unshrunk = f"{name}-no-shrink"
        settings.register_profile(
            unshrunk,
            parent=parent,
            phases=[p for p in parent.phases if p not in (Phase.shrink, Phase.explain)],
        )
        name = unshrunk
    settings.load_profile(name)
    without_local_constants()
    # Hypothesis reads this module constant each time it starts shrinking a property's failures.
    _engine.MAX_SHRINKING_SECONDS = shrink_seconds(name)
    _engine.report = _report_budget
    return name


def without_local_constants() -> None:
    """No constants harvested from local source in any draw (see the module docstring).

    Hypothesis has no setting for it: its provider looks the pool up through this module
    function at each test case, so an empty pool in its place turns the harvest off, and the
    cache of permitted constants built from the old pool is cleared. A Hypothesis before 6.132
    harvests nothing: there is nothing to turn off."""
    if _NO_CONSTANTS is None:
        return
    _providers._get_local_constants = _no_constants
    _providers.CONSTANTS_CACHE.cache.clear()


_NO_CONSTANTS = _providers.Constants() if hasattr(_providers, "_get_local_constants") else None


def _no_constants():
    return _NO_CONSTANTS


_hypothesis_report = _engine.report


def _report_budget(value) -> None:
    """Hypothesis' reporter, saying the truth when shrinking stops at the suite's budget (its
    own warning speaks of five minutes and asks for a bug report)."""
    if isinstance(value, str) and value.startswith("WARNING: Hypothesis has spent more than"):
        value = (
            f"Shrinking stopped after the {_engine.MAX_SHRINKING_SECONDS} s per property that "
            "the conformance profile allows: the failing example is real, though perhaps not "
            "the smallest. --canary-no-shrink skips shrinking; the nightly profile shrinks longer."
        )
    _hypothesis_report(value)


def examples(share: float = 1.0) -> settings:
    """A ``@settings`` decorator running ``share`` of the loaded profile's examples (at least 2)."""
    return settings(max_examples=max(2, round(settings.default.max_examples * share)))


# Set by the plugin once the device is known: data sizes shrink with the example counts.
ON_CPU = True
# Set by the plugin from the implementation's CANARY_CAPABILITIES (conformance.expectations):
# the highest rank, rows included, of a source tensor it takes; None, no limit. Every layout the
# suite draws or fixes is kept within it (layout_sizes(), strategies.fit_source_ndim).
SOURCE_NDIM_MAX: int | None = None


def layout_sizes() -> dict:
    """Size caps for :func:`strategies.source_layouts` on this run's device, and the rank cap
    of the implementation under test (:data:`SOURCE_NDIM_MAX`)."""
    if ON_CPU:
        return dict(max_rows=4, max_page_size=8, max_bytes_per_token=128, max_ndim=SOURCE_NDIM_MAX)
    return dict(max_rows=16, max_page_size=32, max_bytes_per_token=512, max_ndim=SOURCE_NDIM_MAX)


def engine_sizes() -> dict:
    """Engines of ``conformance/test_engine.py`` on this run's device (keywords of
    :func:`strategies.engines.engine_configs`): a few dozen slots of pages of 1, 2, 4 and 8, or
    a few hundred of pages of 16 (a context of two pages), under the interpreter, windows of 3
    and 5; thousands of slots on a GPU, pages up to 64 slots as
    SGLang serves and windows of several pages."""
    if ON_CPU:
        return dict(max_pages=24, max_context_len=16, max_rows=6, page_sizes=(1, 2, 4, 8, 16))
    return dict(max_pages=4096, max_context_len=1024, max_rows=64,
                page_sizes=(1, 2, 4, 16, 64), windows=(0, 0, 3, 5, 40, 130))  # fmt: skip


def engine_step_sizes() -> dict:
    """The steps of an engine history on this run's device: new prompt tokens, prefill chunks,
    the padding rows of a decode batch, and the rules of one history."""
    if ON_CPU:
        return dict(new_tokens=8, chunk=6, pads=(0, 0, 1, 3), steps=25)
    return dict(new_tokens=512, chunk=256, pads=(0, 0, 1, 3, 31), steps=200)


def max_slots() -> int:
    """Longest slot list a property draws on this run's device."""
    return 24 if ON_CPU else 256


def long_slots() -> int | None:
    """``long_size`` of :func:`strategies.slot_indices` for the main fingerprint property:
    on the CPU, where :func:`max_slots` stays inside one kernel program (128 slots), about
    one draw in 12 is a list of 129 to 256 slots, two programs, so block-boundary masking
    runs there too (and no more than two, to keep the interpreter's cost down); None on a
    GPU, whose :func:`max_slots` already spans programs."""
    return 256 if ON_CPU else None


#: Sizes of the engine-scale properties (``conformance/test_scale.py``), per device: on a GPU
#: the sizes engines run; on the CPU, under Triton's interpreter (about 1.7 ms per written
#: token, 0.08 ms per verified entry), the smallest sizes that still cross every edge a
#: scale bug lives at. Each is an inclusive ``(min, max)`` for :func:`strategies.sizes`.
SCALE_SIZES = {
    "cpu": dict(
        prefill_tokens=(8192, 8448),  # one request; entry 4096 and 8192 are chunk edges
        chunk_tokens=(1, 64),  # the next chunk, seeded from the prefill's last slot
        requests=(257, 300),  # one launch; past a grid capped at 256
        decode_entries=2,  # tokens per request of the many-request prefill
        pool_slots=(2**16 + 1, 2**17),  # sources past 16-bit slot indices
        huge_pool_slots=(2**20 + 1, 2**20 + 2**12),  # one source past 2^20 slots
        page_sizes=(65, 256),  # the big-page source: in-page indices past 64
        fingerprint_slots=(1, 512),  # slots per call besides every power-of-two edge
        # a persistent grid of 64 x 512 = 32,768 lanes, then 512 entries of its second lap (at
        # the CPU's rate of reported entries, 1 in 80, some six reports past the lap)
        sweep_entries=(33280, 34304),
        sweep_slots=(2**16 + 1, 2**17),  # the sweep's canary buffer
        ring_rows=(1024, 2048),
    ),
    "gpu": dict(
        prefill_tokens=(8192, 32768),
        chunk_tokens=(1, 4096),
        requests=(257, 1024),
        decode_entries=4,
        pool_slots=(2**16 + 1, 2**20),
        huge_pool_slots=(2**20 + 1, 2**22),
        page_sizes=(65, 256),
        fingerprint_slots=(1, 32768),
        sweep_entries=(33280, 2**16),
        sweep_slots=(2**16 + 1, 2**18),
        ring_rows=(1024, 16384),
    ),
}


def scale_sizes() -> dict:
    """:data:`SCALE_SIZES` of this run's device."""
    return SCALE_SIZES["cpu" if ON_CPU else "gpu"]


#: Share of the loaded profile's examples each engine-scale property runs (times its weight),
#: per device: on the CPU one example in ``ci`` (100 examples: the 8192-token prefill alone
#: takes 14 s), ten in ``nightly``; on a GPU two in ``ci``, twenty in ``nightly``. On a GPU
#: the kernels take milliseconds and the cost is the host's: drawing, the reference and
#: filling pools of millions of slots, seconds per example.
SCALE_SHARE = {"cpu": 0.01, "gpu": 0.01}


def scale_examples(weight: float = 1.0) -> settings:
    """A ``@settings`` decorator for an engine-scale property: ``weight`` times
    :data:`SCALE_SHARE` of the loaded profile's examples, at least one. The decorator reads the
    share when the module is imported, after the plugin has set :data:`ON_CPU`."""
    share = SCALE_SHARE["cpu" if ON_CPU else "gpu"] * weight
    return settings(max_examples=max(1, round(settings.default.max_examples * share)))
