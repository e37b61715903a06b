"""The meters of benchmarks/scale.py: what each arm's process measures while it collects.

Search CPU by kind and per continuation wave (:class:`SearchMeter`), CPU inside the
cyclic garbage collector (:class:`GcMeter`), model calls in flight (:class:`CallMeter`),
where the event loop's thread spends the wall time that is not its CPU (:class:`WallMeter`),
the process's RSS, and the server's occupancy from its request log
(:func:`server_occupancy`). Held apart from the arms (benchmarks/scale_arms.py) that
install them and the command line (benchmarks/scale.py) that runs them.
"""

from __future__ import annotations

import functools
import gc
import inspect
import os
import resource
import selectors
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from focus.priority import Selective
from focus.search import WaveChoice

#: The server counts as underfilled while fewer requests than this share of its slots are in service.
UNDERFILLED = 0.5


def _kind(name: str) -> str:
    if name.startswith("plan"):
        return "plan"
    if name.startswith("graft"):
        return "graft"
    if name in ("unscored", "with_predictions", "score_tree") or "predict" in name:
        return "score"
    return "other"


class SearchMeter:
    """Thread CPU spent inside the search's own functions (planning, grafting, scoring).

    Every public function of the ``focus.search`` package is replaced, in each loaded ``focus``
    module that refers to it (the collector, the execution service), by a wrapper that
    times it with ``time.thread_time``; calls nested inside a timed one are not timed
    again. These functions are synchronous, so nothing else runs on the event loop
    while one is timed. Prepare is timed with :meth:`measure`. Events are kept in order,
    so planning, grafting and scoring can be told apart per continuation wave.
    """

    def __init__(self, search: Selective) -> None:
        self.search = search
        self.cpu: dict[str, float] = {
            "plan": 0.0, "graft": 0.0, "score": 0.0, "prefit": 0.0, "other": 0.0, "prepare": 0.0
        }  # fmt: skip
        self.waves: dict[Any, dict[str, Any]] = {}
        self._current: Any = None
        #: Plan CPU of each wave being chosen a slice at a time, until it is chosen.
        self._choosing: dict[tuple[int, int], float] = {}
        #: Timed calls open on each thread (planning runs in worker threads, the wave's
        #: tail on the event loop's): a call nested in one of its own thread's is not timed.
        self._local = threading.local()
        self._undo: list[tuple[Any, str, Any]] = []
        self.t0 = time.perf_counter()

    def install(self) -> SearchMeter:
        import focus.search as fs

        # the package's public functions (defined in its modules, re-exported by it)
        originals = {
            fn: name
            for name, fn in vars(fs).items()
            if inspect.isfunction(fn)
            and fn.__module__.startswith(fs.__name__ + ".")
            and not name.startswith("_")
            and not inspect.iscoroutinefunction(fn)
        }
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or mod_name.startswith(fs.__name__) or not mod_name.startswith("focus."):
                continue
            for attr, value in list(vars(mod).items()):
                if inspect.isfunction(value) and value in originals:
                    self._undo.append((mod, attr, value))
                    setattr(mod, attr, self._timed(originals[value], value))
        # Planning's work done ahead in a wave's tail (focus.waves.WaveTail), through
        # methods rather than public functions: what the evidence's fit reads of each
        # tree (since h37f), and a lagged refit's fit and the rankings of the trees the
        # wave does not touch under it (REFIT_LAG; the trees it touches are ranked in
        # score_tree, timed as scoring).
        from focus.search.state import SearchState, _TreeFacts
        from focus.waves import WaveTail

        for owner, attr in ((_TreeFacts, "prefit"), (SearchState, "next_calibration"), (WaveTail, "_rank_some")):
            original = getattr(owner, attr)
            self._undo.append((owner, attr, original))
            setattr(owner, attr, self._timed_plain("prefit", original))
        return self

    def uninstall(self) -> None:
        for mod, attr, value in reversed(self._undo):
            setattr(mod, attr, value)
        self._undo.clear()

    @property
    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @_depth.setter
    def _depth(self, value: int) -> None:
        self._local.depth = value

    def measure(self, kind: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        self._depth += 1
        c0 = time.thread_time()
        try:
            return fn(*args, **kw)
        finally:
            self._depth -= 1
            if not self._depth:
                self.cpu[kind] += time.thread_time() - c0

    def _timed_plain(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed as ``kind`` (not nested in another timed call), not tied to a wave."""

        @functools.wraps(fn)
        def timed(*args: Any, **kw: Any) -> Any:
            return self.measure(kind, fn, *args, **kw)

        return timed

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        kind = _kind(name)
        signature = inspect.signature(fn)
        # Only planning and grafting read the call's arguments (which wave it is); binding
        # them for every scoring call too was the meter's own CPU, counted as FOCUS's search.
        bound = kind in ("plan", "graft")

        @functools.wraps(fn)
        def timed(*args: Any, **kw: Any) -> Any:
            if self._depth:
                return fn(*args, **kw)
            self._depth += 1
            c0 = time.thread_time()
            try:
                out = fn(*args, **kw)
            finally:
                self._depth -= 1
                cpu = time.thread_time() - c0
                self.cpu[kind] += cpu
            self._record(kind, signature.bind(*args, **kw).arguments if bound else {}, out, cpu)
            return out

        return timed

    def _record(self, kind: str, arguments: dict[str, Any], out: Any, cpu: float) -> None:
        """Attach one timed call to the continuation wave it belongs to (a wave chosen a
        slice at a time, ``plan_begin`` / ``plan_choose`` / ``plan_chosen``: the sum of
        its calls, the wave's entry made at the last)."""
        choice = arguments.get("choice", out if isinstance(out, WaveChoice) else None)
        if kind == "plan" and choice is not None:
            key = (choice.phase_index, choice.wave_index)
            self._choosing[key] = self._choosing.get(key, 0.0) + cpu
            if not hasattr(out, "planned"):
                return
            arguments, cpu = {"state": choice.state, "phase_index": key[0]}, self._choosing.pop(key)
        if kind == "plan":
            wave = arguments.get("wave_index", len(self.waves))
            if hasattr(out, "planned"):  # plan_next / plan_ahead: a state with the new wave planned
                new = out.planned[-1] if out is not arguments.get("state") and out.planned else None
                jobs = new.jobs if new is not None else ()
                wave = new.wave_index if new is not None else wave
            else:
                jobs = getattr(out, "jobs", out)
            n = len(jobs) if isinstance(jobs, (tuple, list)) else 0
            phase = arguments.get("phase_index")
            if not n or phase is None or self.search.phases[phase].is_evidence:
                self._current = None
                return
            self._current = (phase, wave)
            self.waves[self._current] = {
                "phase": phase,
                "wave": wave,
                "jobs": n,
                "at_s": round(time.perf_counter() - self.t0, 4),
                "plan_ms": 1000 * cpu,
                "graft_ms": 0.0,
                "score_ms": 0.0,
            }
            return
        if kind == "graft":
            plan = arguments.get("plan")
            key = (getattr(plan, "phase_index", None), getattr(plan, "wave_index", None))
            self._current = key if key in self.waves else self._current
        entry = self.waves.get(self._current)
        if entry is not None and kind in ("graft", "score"):
            entry[f"{kind}_ms"] += 1000 * cpu

    def wave_figures(self) -> dict[str, Any]:
        waves = [{k: round(v, 3) if isinstance(v, float) else v for k, v in w.items()} for w in self.waves.values()]
        out: dict[str, Any] = {"continuation_waves": len(waves), "per_wave": waves}
        if waves:
            q = max(1, len(waves) // 4)
            for name, part in (("first", waves[:q]), ("last", waves[-q:])):
                for k in ("plan", "graft", "score"):
                    out[f"{k}_cpu_ms_per_wave_{name}_quarter"] = sum(w[f"{k}_ms"] for w in part) / len(part)
                # a wave's jobs grow where the plan picks later checkpoints (a wave is counted
                # in transitions): its plan CPU per wave grows with them, per job it need not
                out[f"jobs_per_wave_{name}_quarter"] = sum(w["jobs"] for w in part) / len(part)
            first = out["plan_cpu_ms_per_wave_first_quarter"]
            out["plan_cpu_per_wave_last_vs_first_quarter"] = (
                out["plan_cpu_ms_per_wave_last_quarter"] / first if first > 0 else None
            )
        return out


class GcMeter:
    """Thread CPU inside Python's cyclic garbage collector (``gc.callbacks``), and the
    number of full (generation 2) collections. The baseline's loop runs with the default
    GC, as a user's loop would; ``Execution`` keeps the trees out of it while a wave runs.
    What that difference costs is this figure."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.full_collections = 0
        self._t: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.thread_time()
        elif self._t is not None:
            self.cpu += time.thread_time() - self._t
            self.full_collections += info.get("generation") == 2
            self._t = None

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


#: Shortest stretch with no call in flight that :class:`CallMeter` lists on its own
#: (``idle_gaps_ms``): shorter ones are the loop's turns between calls, not barriers.
GAP_LISTED_S = 0.002


class CallMeter:
    """Model calls in flight from this process over time: the share of the collection
    during which none is (``idle_share``), counted as it goes, nothing stored per call.

    The window runs from the first call's start to the last call's end; every stretch
    inside it with no call in flight (a wave's barrier: grafting, scoring and planning
    the next wave after the last call of one has returned) counts as idle. Nothing else
    sends to the server, so the server is idle at least that long; it can be idle
    longer while calls are in flight here (answers waiting in sockets for a busy
    process), which :func:`server_occupancy` counts and a loaded machine inflates,
    while this share stays a property of the collection's schedule."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.calls = 0
        self.first: float | None = None
        self.last_end: float | None = None
        self.idle_s = 0.0
        #: The stretches with no call in flight of at least GAP_LISTED_S: the barriers.
        self.gaps: list[tuple[float, float]] = []

    def install(self, policy: Any) -> CallMeter:
        inner = policy.sample_on_route

        async def sample_on_route(prompt_ids: Any, params: Any, route: Any) -> Any:
            now = time.perf_counter()
            if not self.in_flight:
                if self.last_end is None:
                    self.first = now
                else:
                    self.idle_s += now - self.last_end
                    if now - self.last_end >= GAP_LISTED_S:
                        self.gaps.append((self.last_end, now))
            self.in_flight += 1
            self.calls += 1
            try:
                return await inner(prompt_ids, params, route)
            finally:
                self.in_flight -= 1
                if not self.in_flight:
                    self.last_end = time.perf_counter()

        policy.sample_on_route = sample_on_route
        return self

    def figures(self) -> dict[str, Any]:
        window = (self.last_end - self.first) if self.first is not None and self.last_end is not None else 0.0
        return {
            "calls_window_s": window,
            "idle_s": self.idle_s,
            "idle_share": self.idle_s / window if window > 0 else None,
            # each barrier: (ms into the window, ms long), largest first
            "idle_gaps_ms": sorted(
                ((round(1000 * (a - (self.first or a)), 1), round(1000 * (b - a), 1)) for a, b in self.gaps),
                key=lambda g: -g[1],
            ),
        }


def thread_schedstat() -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of the calling thread,
    from Linux's ``/proc/thread-self/schedstat``; None where there is none."""
    try:
        on_cpu, waiting = Path("/proc/thread-self/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


class WallMeter:
    """Where the event loop's thread spends an arm's wall time: on a CPU (its own
    thread CPU), runnable but waiting for a CPU (``runqueue_s``: the machine's other
    load, the server process included), asleep in the event loop's selector with a
    model call in flight (``loop_wait_calls_s``: waiting on the server's answers) or
    with none (``loop_wait_idle_s``: a barrier waiting on a planning thread, or before
    the first call), and the rest (``other_wait_s``: waiting for the GIL a worker thread
    holds, and whatever else blocks). A process whose wall exceeds its CPU for the
    first reason is slowed by the machine, not by its schedule. ``other_wait_s`` is what is
    left of the wall after the rest, so it carries their clocks' disagreements too (a few
    tens of milliseconds either way in a run of seconds: it can come out below zero).

    The selector is timed by wrapping ``selectors.DefaultSelector.select`` while the
    meter is on (the arm's loop is made inside it); ``calls`` (a :class:`CallMeter`)
    tells a wait with calls in flight from one without."""

    def __init__(self, calls: CallMeter | None = None) -> None:
        self.calls = calls
        self.loop_wait_calls_s = self.loop_wait_idle_s = 0.0
        self._start: tuple[float, float, tuple[float, float] | None] | None = None
        self.figures_: dict[str, Any] = {}

    def __enter__(self) -> WallMeter:
        cls = selectors.DefaultSelector
        inner = cls.select
        main = threading.main_thread()

        def select(sel: Any, timeout: float | None = None) -> Any:
            if threading.current_thread() is not main:
                return inner(sel, timeout)
            t0 = time.perf_counter()
            try:
                return inner(sel, timeout)
            finally:
                waited = time.perf_counter() - t0
                if self.calls is not None and self.calls.in_flight:
                    self.loop_wait_calls_s += waited
                else:
                    self.loop_wait_idle_s += waited

        self._undo = (cls, inner)
        cls.select = select  # type: ignore[method-assign]
        self._start = (time.perf_counter(), time.thread_time(), thread_schedstat())
        return self

    def __exit__(self, *exc: object) -> None:
        cls, inner = self._undo
        cls.select = inner  # type: ignore[method-assign]
        assert self._start is not None
        t0, c0, s0 = self._start
        wall, cpu, s1 = time.perf_counter() - t0, time.thread_time() - c0, thread_schedstat()
        runqueue = s1[1] - s0[1] if s0 is not None and s1 is not None else None
        known = cpu + (runqueue or 0.0) + self.loop_wait_calls_s + self.loop_wait_idle_s
        self.figures_ = {
            "main_thread_cpu_s": cpu,
            "runqueue_s": runqueue,
            "runqueue_share": runqueue / wall if runqueue is not None and wall > 0 else None,
            "loop_wait_calls_s": self.loop_wait_calls_s,
            "loop_wait_idle_s": self.loop_wait_idle_s,
            "other_wait_s": wall - known,
        }

    def figures(self) -> dict[str, Any]:
        return dict(self.figures_)


def rss_now_mib() -> float | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def server_occupancy(log: Sequence[Sequence[Any]], slots: int) -> dict[str, Any]:
    """How much of the collection the server spent without work, from its request log
    (``GET /requests``: arrival, slot acquired and done, in seconds, per request).

    The window runs from the first request's arrival to the last one's answer, so the
    env resets before it and the batch preparation after it do not count; inside it,
    the server is *idle* while no request is in it (queued or in service), and
    *underfilled* while fewer than ``UNDERFILLED`` x ``slots`` are in service. Both as
    shares of the window: what a wave barrier costs a real server is the idle share
    (nothing to batch at all) and, less sharply, the underfilled one (small batches
    while a wave's tail drains and the next is planned)."""
    if not log:
        return {"server_window_s": 0.0, "server_idle_share": None, "server_underfilled_share": None}
    present: list[tuple[float, int]] = []
    serving: list[tuple[float, int]] = []
    for row in log:
        arrived, acquired, done = float(row[0]), float(row[1]), float(row[2])
        present += ((arrived, 1), (done, -1))
        serving += ((acquired, 1), (done, -1))
    start, end = min(t for t, _ in present), max(t for t, _ in present)
    window = end - start

    def time_below(events: list[tuple[float, int]], bound: float) -> float:
        """Seconds of the window during which the count of open intervals is below ``bound``
        (an interval that closes at the instant another opens leaves no gap)."""
        events.sort(key=lambda e: (e[0], -e[1]))
        below, level, last = 0.0, 0, start
        for t, step in events:
            if level < bound:
                below += t - last
            level += step
            last = t
        return below

    idle = time_below(present, 1)
    low = time_below(serving, UNDERFILLED * slots)
    return {
        "server_window_s": window,
        "server_idle_share": idle / window if window > 0 else 0.0,
        "server_underfilled_share": low / window if window > 0 else 0.0,
    }
